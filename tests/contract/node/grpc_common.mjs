// Shared by the Node clients: loads @grpc/grpc-js and @grpc/proto-loader from tools/node_modules
// (installed by `./run setup`, `npm ci` in tools/) and the contract from protos/.
//
// ES modules ignore NODE_PATH, so the packages are resolved with a require() anchored at
// tools/package.json; the scripts then work from any working directory.

import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "..", "..", "..");
export const protosDir = path.join(repoRoot, "protos");
const toolsDir = path.join(repoRoot, "tools");
const toolsRequire = createRequire(path.join(toolsDir, "package.json"));

function load(name) {
  try {
    return toolsRequire(name);
  } catch (err) {
    process.stderr.write(
      `cannot load ${name} from ${toolsDir}/node_modules (run \`npm ci\` in tools/): ${err.message}\n`,
    );
    process.exit(3);
  }
}

export const grpc = load("@grpc/grpc-js");
const protoLoader = load("@grpc/proto-loader");

// proto-loader ships no .proto files of its own: google/protobuf/timestamp.proto (like the other
// common well-known types) is bundled inside protobufjs as JSON and protobufjs resolves the import
// to that bundled definition before consulting the include path. The protobufjs package directory
// is still listed so the well-known types it does ship as files (descriptor.proto, api.proto, ...)
// would resolve too.
const protobufjsDir = path.dirname(
  createRequire(toolsRequire.resolve("@grpc/proto-loader")).resolve("protobufjs/package.json"),
);

export const LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true, // a oneof's name holds the name of the member that is set (TurnEvent.event)
  includeDirs: [protosDir, protobufjsDir],
};

/** Loads a .proto file (path relative to protos/) and returns the grpc-js package object. */
export function loadContract(relativePath) {
  const definition = protoLoader.loadSync(relativePath, LOADER_OPTIONS);
  return grpc.loadPackageDefinition(definition);
}

/** The name of a status code ("NOT_FOUND"), or the number when it is unknown. */
export function statusName(code) {
  return Object.keys(grpc.status).find((name) => grpc.status[name] === code) ?? code;
}

export const DEADLINE_MS = 15_000;

/**
 * One unary call, never rejecting: {ok: true, response} or {ok: false, code, details, trailers}.
 * On a failed call grpc-js hands the trailing metadata over as `err.metadata`.
 */
export function unary(client, method, request, metadata = new grpc.Metadata()) {
  return new Promise((resolve) => {
    client[method](
      request,
      metadata,
      { deadline: Date.now() + DEADLINE_MS },
      (err, response) => {
        if (err) {
          resolve({
            ok: false,
            code: statusName(err.code),
            details: err.details,
            trailers: err.metadata ? err.metadata.getMap() : {},
          });
        } else {
          resolve({ ok: true, response });
        }
      },
    );
  });
}

/**
 * Reads a server stream to its end: {events, code, details}. Waits for both the status and the
 * end of the readable side ('end', or 'error' for a failed call) so no buffered event is lost.
 */
export function readStream(call) {
  return new Promise((resolve) => {
    const events = [];
    let status = null;
    let drained = false;
    const settle = () => {
      if (status && drained) {
        resolve({ events, code: statusName(status.code), details: status.details ?? "" });
      }
    };
    call.on("data", (response) => events.push(response.event));
    call.on("end", () => {
      drained = true;
      settle();
    });
    call.on("error", () => {
      drained = true; // the same failure also arrives as the 'status' event
      settle();
    });
    call.on("status", (received) => {
      status = received;
      settle();
    });
  });
}

/** Prints the result as one JSON line; exits 1 when any check failed. */
export function finish(result, failures) {
  process.stdout.write(`${JSON.stringify({ ...result, failures })}\n`);
  process.exit(failures.length ? 1 : 0);
}

/** Runs main(); an exception is printed as JSON and exits 2. */
export function run(main) {
  main().catch((err) => {
    process.stdout.write(`${JSON.stringify({ error: String(err?.stack ?? err) })}\n`);
    process.exit(2);
  });
}
