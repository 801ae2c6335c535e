// A Node (grpc-js) client of agentstate.agent.v1.AgentService, for the cross-language tests.
//
//   node tests/contract/node/agent_client.mjs ADDRESS USER_ID QUESTION
//
// Sends Chat with the `agentstate-user-id` metadata and reads the stream to its end; when the
// turn stops at a confirmation card it answers Confirm(approved=false) with only the three ids
// and the decision, and reads that stream too. Prints one JSON summary; exits 1 when a stream
// ended with an error status, 2 on a crash.

import { finish, grpc, loadContract, readStream, run } from "./grpc_common.mjs";

const [address, userId, question] = process.argv.slice(2);
if (!address || !userId || !question) {
  process.stderr.write("usage: node agent_client.mjs ADDRESS USER_ID QUESTION\n");
  process.exit(64);
}

const DEADLINE_MS = 60_000;

/** What a turn's events say, in the shape the Python test reads. */
function summarize(turn) {
  const kinds = turn.events.map((event) => event.event);
  const of = (kind) => turn.events.filter((e) => e.event === kind).map((e) => e[kind]);
  const reply = of("message")
    .filter((m) => m.type === "MESSAGE_TYPE_RESPONSE")
    .map((m) => m.delta)
    .join("");
  const card = of("confirm")[0];
  const finished = of("finish")[0];
  return {
    code: turn.code,
    details: turn.details,
    kinds,
    reply,
    meta: of("meta")[0] ?? null,
    blocks: of("block").map((b) => ({
      call_id: b.call_id,
      tool_name: b.tool_name,
      status: b.status,
      arguments: b.arguments_json.length
        ? JSON.parse(Buffer.from(b.arguments_json).toString("utf8"))
        : null,
      summary: b.summary,
    })),
    card: card
      ? {
          message_id: card.message_id,
          title: card.title,
          expire_time: card.expire_time,
          calls: card.calls.map((c) => ({
            call_id: c.call_id,
            tool_name: c.tool_name,
            title: c.title,
            display_fields: c.display_fields,
            arguments: JSON.parse(Buffer.from(c.arguments_json).toString("utf8")),
          })),
        }
      : null,
    finish: finished ?? null,
  };
}

async function main() {
  const pkg = loadContract("agentstate/agent/v1/agent_service.proto");
  const client = new pkg.agentstate.agent.v1.AgentService(
    address,
    grpc.credentials.createInsecure(),
  );
  const metadata = new grpc.Metadata();
  metadata.set("agentstate-user-id", userId);
  const failures = [];

  const chat = summarize(
    await readStream(
      client.Chat({ question }, metadata, { deadline: Date.now() + DEADLINE_MS }),
    ),
  );
  if (chat.code !== "OK") failures.push(`Chat ended with ${chat.code}: ${chat.details}`);
  const out = { conversation_id: chat.meta?.conversation_id ?? null, chat, confirm: null };

  if (chat.card) {
    const confirm = summarize(
      await readStream(
        client.Confirm(
          {
            conversation_id: out.conversation_id,
            message_id: chat.card.message_id,
            approved: false,
          },
          metadata,
          { deadline: Date.now() + DEADLINE_MS },
        ),
      ),
    );
    if (confirm.code !== "OK") {
      failures.push(`Confirm ended with ${confirm.code}: ${confirm.details}`);
    }
    out.confirm = confirm;
  }

  client.close();
  finish(out, failures);
}

run(main);
