// A Node (grpc-js) caller of the state service over TLS with a client certificate (mTLS),
// for the transport-security tests.
//
//   node tests/contract/node/tls_client.mjs ADDRESS CA_FILE CERT_FILE KEY_FILE USER_ID CONVERSATION_ID
//
// Lists the user's conversations (its rule allows that) and reads one state (its rule does
// not): prints {"listed": [...], "get_state": {code, reason}} and exits 1 when the state
// service did not answer as its policy says.

import { readFileSync } from "node:fs";

import { finish, grpc, loadContract, run, unary } from "./grpc_common.mjs";

const [address, caFile, certFile, keyFile, userId, conversationId] = process.argv.slice(2);
if (!conversationId) {
  process.stderr.write("usage: node tls_client.mjs ADDRESS CA CERT KEY USER_ID CONVERSATION_ID\n");
  process.exit(64);
}

// The protobuf wire format, just enough for google.rpc.Status: its length-delimited fields.
function fields(bytes) {
  const out = [];
  let i = 0;
  const varint = () => {
    let value = 0;
    let shift = 0;
    for (;;) {
      const byte = bytes[i++];
      value += (byte & 0x7f) * 2 ** shift;
      if (byte < 0x80) return value;
      shift += 7;
    }
  };
  while (i < bytes.length) {
    const key = varint();
    const wire = key & 7;
    if (wire === 0) varint();
    else if (wire === 2) {
      const length = varint();
      out.push([key >>> 3, bytes.subarray(i, i + length)]);
      i += length;
    } else throw new Error(`unexpected wire type ${wire}`);
  }
  return out;
}

// grpc-status-details-bin holds a google.rpc.Status: details (field 3) are Any (type_url 1,
// value 2); the ErrorInfo's reason is its field 1.
function reasonOf(trailers) {
  const raw = trailers["grpc-status-details-bin"];
  if (!raw) return "";
  for (const [number, any] of fields(Buffer.from(raw))) {
    if (number !== 3) continue;
    const parts = Object.fromEntries(fields(any));
    if (Buffer.from(parts[1]).toString() !== "type.googleapis.com/google.rpc.ErrorInfo") continue;
    const info = Object.fromEntries(fields(parts[2]));
    return Buffer.from(info[1]).toString();
  }
  return "";
}

async function main() {
  const pkg = loadContract("agentstate/state/v1/state_service.proto");
  const credentials = grpc.credentials.createSsl(
    readFileSync(caFile),
    readFileSync(keyFile),
    readFileSync(certFile),
  );
  const client = new pkg.agentstate.state.v1.StateService(address, credentials);
  const failures = [];
  const listed = await unary(client, "ListConversations", { user_id: userId });
  if (!listed.ok) failures.push(`ListConversations: ${listed.code} ${listed.details}`);
  const got = await unary(client, "GetState", { user_id: userId, conversation_id: conversationId });
  const result = {
    listed: listed.ok ? listed.response.conversations.map((c) => c.conversation_id) : [],
    get_state: got.ok
      ? { code: "OK" }
      : { code: got.code, reason: reasonOf(got.trailers), details: got.details },
  };
  if (got.ok) failures.push("GetState was allowed");
  client.close();
  finish(result, failures);
}

run(main);
