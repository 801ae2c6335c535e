// Reads one conversation with the project's service config, for the retry test.
//
//   java -cp ... RetryCheck ADDRESS CONVERSATION_ID USER_ID SERVICE_CONFIG_JSON
//
// tests/contract/test_xlang_clients.py serves it UNAVAILABLE a few times first: with the config passed
// as grpc-java expects (a parsed JSON map, and retries enabled) the channel retries the read.
// Prints {"code": ..., "conversation_id": ...}; exits 1 unless the read succeeded.

import com.google.gson.Gson;
import io.agentstate.state.v1.GetConversationRequest;
import io.agentstate.state.v1.GetConversationResponse;
import io.agentstate.state.v1.StateServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.StatusRuntimeException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;

public final class RetryCheck {
  public static void main(String[] args) throws Exception {
    if (args.length != 4) {
      System.err.println("usage: RetryCheck ADDRESS CONVERSATION_ID USER_ID SERVICE_CONFIG_JSON");
      System.exit(64);
    }
    String json = Files.readString(Path.of(args[3]), StandardCharsets.UTF_8);
    @SuppressWarnings("unchecked")
    Map<String, ?> config = new Gson().fromJson(json, Map.class);
    ManagedChannel channel =
        ManagedChannelBuilder.forTarget(args[0])
            .usePlaintext()
            .defaultServiceConfig(config)
            .enableRetry()
            .build();
    Map<String, String> result = new LinkedHashMap<>();
    try {
      GetConversationResponse got =
          StateServiceGrpc.newBlockingStub(channel)
              .withDeadlineAfter(20, TimeUnit.SECONDS)
              .getConversation(
                  GetConversationRequest.newBuilder()
                      .setUserId(args[2])
                      .setConversationId(args[1])
                      .build());
      result.put("code", "OK");
      result.put("conversation_id", got.getConversation().getConversationId());
    } catch (StatusRuntimeException e) {
      result.put("code", e.getStatus().getCode().name());
    } finally {
      channel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
    System.out.println(new Gson().toJson(result));
    System.exit("OK".equals(result.get("code")) ? 0 : 1);
  }
}
