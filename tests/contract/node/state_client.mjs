// A Node (grpc-js) client of agentstate.state.v1.StateService, for the cross-language tests.
//
//   node tests/contract/node/state_client.mjs ADDRESS [USER_ID]
//
// Exercises the contract the way a service in another language would and prints one JSON
// object with what it observed; exits 1 when anything differed from the contract, 2 on a crash.

import { randomUUID } from "node:crypto";
import { isDeepStrictEqual } from "node:util";

import { finish, grpc, loadContract, run, unary } from "./grpc_common.mjs";

const [address, userArg] = process.argv.slice(2);
if (!address) {
  process.stderr.write("usage: node state_client.mjs ADDRESS [USER_ID]\n");
  process.exit(64);
}

const PAYLOAD = {
  greeting: "你好，世界",
  order: { id: 88235, status: "已支付待发货", amount: "3378.00", items: ["Apple Watch", "运动表带"] },
  note: "我买的那块Apple Watch还没发货的话，帮我取消吧，不想要了。",
  nested: [1, 2.5, true, null, { emoji: "⌚" }],
};
const BLOCKS = [{ type: "text", text: "帮我取消订单 88235" }];

async function main() {
  const pkg = loadContract("agentstate/state/v1/state_service.proto");
  const client = new pkg.agentstate.state.v1.StateService(
    address,
    grpc.credentials.createInsecure(),
  );
  const userId = userArg || `node-${randomUUID()}`;
  const otherUserId = `node-other-${randomUUID()}`;
  const failures = [];
  const expect = (condition, message) => {
    if (!condition) failures.push(message);
  };
  const must = (result, what) => {
    if (!result.ok) {
      failures.push(`${what} failed: ${result.code} ${result.details}`);
      finish({ user_id: userId, stopped_at: what }, failures);
    }
    return result.response;
  };
  const out = { user_id: userId };

  // CreateConversation: the id is a server-generated 64-bit integer as a decimal string.
  const created = must(
    await unary(client, "CreateConversation", { user_id: userId, title: "跨语言测试" }),
    "CreateConversation",
  );
  const conversationId = created.conversation.conversation_id;
  out.conversation = {
    conversation_id: conversationId,
    title: created.conversation.title,
    user_id: created.conversation.user_id,
    create_time: created.conversation.create_time,
  };
  expect(/^[1-9][0-9]*$/.test(conversationId), `conversation id ${conversationId} is not decimal`);
  expect(created.conversation.title === "跨语言测试", "the title did not round-trip");

  // UpsertState, create only (expected_version 0), with one message record insert.
  const payloadBytes = Buffer.from(JSON.stringify(PAYLOAD), "utf8");
  const first = must(
    await unary(client, "UpsertState", {
      user_id: userId,
      conversation_id: conversationId,
      payload: payloadBytes,
      expected_version: 0,
      message_writes: [
        {
          insert: {
            role: "MESSAGE_ROLE_USER",
            blocks_json: Buffer.from(JSON.stringify(BLOCKS), "utf8"),
            metadata_json: Buffer.from(JSON.stringify({ source: "grpc-js" }), "utf8"),
          },
        },
      ],
    }),
    "UpsertState(expected_version=0)",
  );
  const inserted = first.messages[0];
  out.create_upsert = {
    version: first.version,
    version_type: typeof first.version,
    update_time: first.update_time,
    messages: first.messages.map((m) => ({ message_id: m.message_id, status: m.status })),
  };
  expect(first.version === "1", `first version is ${JSON.stringify(first.version)}, not "1"`);
  expect(first.messages.length === 1, "UpsertState did not return the inserted record");

  // GetState: the JSON value round-trips (JSONB may reorder keys, so compare parsed).
  const got = must(
    await unary(client, "GetState", { user_id: userId, conversation_id: conversationId }),
    "GetState",
  );
  const gotPayload = JSON.parse(Buffer.from(got.payload).toString("utf8"));
  out.get_state = {
    version: got.version,
    payload: gotPayload,
    payload_equal: isDeepStrictEqual(gotPayload, PAYLOAD),
    payload_is_buffer: Buffer.isBuffer(got.payload),
  };
  expect(out.get_state.payload_equal, "GetState returned a different JSON value");
  expect(got.version === "1", `GetState version ${JSON.stringify(got.version)}`);

  // Compare-and-set with the right version (an int64 sent as a decimal string) succeeds.
  const second = must(
    await unary(client, "UpsertState", {
      user_id: userId,
      conversation_id: conversationId,
      payload: Buffer.from(JSON.stringify({ ...PAYLOAD, step: 2 }), "utf8"),
      expected_version: "1",
    }),
    "UpsertState(expected_version=1)",
  );
  out.cas_upsert = { version: second.version };
  expect(second.version === "2", `compare-and-set produced version ${second.version}`);

  // A stale expected_version is ABORTED and the trailer names the current version.
  const stale = await unary(client, "UpsertState", {
    user_id: userId,
    conversation_id: conversationId,
    payload: Buffer.from(JSON.stringify({ stale: true }), "utf8"),
    expected_version: 1,
  });
  out.stale_upsert = {
    ok: stale.ok,
    code: stale.code,
    details: stale.details,
    current_version: stale.trailers?.["agentstate-current-version"],
  };
  expect(stale.code === "ABORTED", `stale write gave ${stale.code}`);
  expect(
    out.stale_upsert.current_version === "2",
    `agentstate-current-version trailer is ${JSON.stringify(out.stale_upsert.current_version)}`,
  );
  // Create-only on an existing state is ABORTED as well.
  const recreate = await unary(client, "UpsertState", {
    user_id: userId,
    conversation_id: conversationId,
    payload: Buffer.from("{}", "utf8"),
    expected_version: 0,
  });
  out.create_only_again = {
    code: recreate.code,
    current_version: recreate.trailers?.["agentstate-current-version"],
  };
  expect(recreate.code === "ABORTED", `second create-only write gave ${recreate.code}`);

  // Another user's conversation is NOT_FOUND, and the trailer says what is missing.
  const foreign = await unary(client, "GetState", {
    user_id: otherUserId,
    conversation_id: conversationId,
  });
  out.other_user_get = {
    ok: foreign.ok,
    code: foreign.code,
    details: foreign.details,
    missing: foreign.trailers?.["agentstate-missing"],
  };
  expect(foreign.code === "NOT_FOUND", `another user's GetState gave ${foreign.code}`);
  expect(
    out.other_user_get.missing === "conversation",
    `agentstate-missing trailer is ${JSON.stringify(out.other_user_get.missing)}`,
  );

  // ListMessages: the record written with the state, in order, JSON bytes intact.
  const listed = must(
    await unary(client, "ListMessages", { user_id: userId, conversation_id: conversationId }),
    "ListMessages",
  );
  out.list_messages = {
    next_page_token: listed.next_page_token,
    messages: listed.messages.map((m) => ({
      message_id: m.message_id,
      conversation_id: m.conversation_id,
      role: m.role,
      status: m.status,
      blocks: JSON.parse(Buffer.from(m.blocks_json).toString("utf8")),
      metadata: JSON.parse(Buffer.from(m.metadata_json).toString("utf8")),
    })),
  };
  const record = out.list_messages.messages[0];
  expect(listed.messages.length === 1, `ListMessages returned ${listed.messages.length} records`);
  expect(record?.message_id === inserted?.message_id, "ListMessages returned another record");
  expect(record?.role === "MESSAGE_ROLE_USER", `record role ${record?.role}`);
  expect(record?.status === "MESSAGE_STATUS_NORMAL", `record status ${record?.status}`);
  expect(isDeepStrictEqual(record?.blocks, BLOCKS), "the record's blocks did not round-trip");

  // DeleteConversation removes conversation, message and state in one transaction.
  const deleted = must(
    await unary(client, "DeleteConversation", {
      user_id: userId,
      conversation_id: conversationId,
    }),
    "DeleteConversation",
  );
  out.delete = deleted;
  expect(
    deleted.conversations_deleted === "1" &&
      deleted.messages_deleted === "1" &&
      deleted.states_deleted === "1",
    `DeleteConversation counts ${JSON.stringify(deleted)}`,
  );
  const after = await unary(client, "GetState", {
    user_id: userId,
    conversation_id: conversationId,
  });
  out.get_after_delete = { code: after.code, missing: after.trailers?.["agentstate-missing"] };
  expect(after.code === "NOT_FOUND", `GetState after delete gave ${after.code}`);

  client.close();
  finish(out, failures);
}

run(main);
