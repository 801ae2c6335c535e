// Reads one conversation with the project's service config, for the retry test.
//
//   node tests/contract/node/retry_check.mjs ADDRESS CONVERSATION_ID USER_ID SERVICE_CONFIG_JSON
//
// tests/contract/test_xlang_clients.py serves it UNAVAILABLE a few times first: with the config passed
// as the "grpc.service_config" channel option, grpc-js retries the read.
// Prints {"code": ..., "conversation_id": ...}; exits 1 unless the read succeeded.

import fs from "node:fs";

import { grpc, loadContract } from "./grpc_common.mjs";

const [address, conversationId, userId, configPath] = process.argv.slice(2);
if (!configPath) {
  process.stderr.write("usage: node retry_check.mjs ADDRESS CONVERSATION_ID USER_ID CONFIG\n");
  process.exit(64);
}
const pkg = loadContract("agentstate/state/v1/state_service.proto");
const client = new pkg.agentstate.state.v1.StateService(
  address,
  grpc.credentials.createInsecure(),
  { "grpc.service_config": fs.readFileSync(configPath, "utf8") },
);
client.GetConversation(
  { user_id: userId, conversation_id: conversationId },
  { deadline: Date.now() + 20_000 },
  (err, response) => {
    const result = err
      ? { code: grpc.status[err.code] }
      : { code: "OK", conversation_id: response.conversation.conversation_id };
    process.stdout.write(`${JSON.stringify(result)}\n`);
    client.close();
    process.exitCode = err ? 1 : 0;
  },
);
