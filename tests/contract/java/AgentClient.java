// A Java (grpc-java) client of both services, for the cross-language tests.
//
//   java -cp ... AgentClient AGENT_ADDRESS STATE_ADDRESS USER_ID QUESTION SERVICE_CONFIG_JSON
//
// Built by tests/contract/test_xlang_clients.py with javac against Debian's jars, with stubs generated
// by protoc and protoc-gen-grpc-java from protos/. It drives the source's worked example
// through the agent service the way an internal Java service would: Chat with the question
// (identity in the agentstate-user-id metadata), the confirmation card, Confirm with
// approved=false, the reply; then it reads the stored 8-message AgentState from the state
// service. Every status it meets is checked, with the google.rpc.ErrorInfo detail read through
// StatusProto. It prints one JSON object and exits 1 when anything differed from the contract.

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.ErrorInfo;
import io.agentstate.agent.v1.AgentServiceGrpc;
import io.agentstate.agent.v1.ChatRequest;
import io.agentstate.agent.v1.ConfirmRequest;
import io.agentstate.agent.v1.ListConversationsRequest;
import io.agentstate.agent.v1.ToolCallStatus;
import io.agentstate.agent.v1.TurnEvent;
import io.agentstate.state.v1.GetStateRequest;
import io.agentstate.state.v1.GetStateResponse;
import io.agentstate.state.v1.MessageStatus;
import io.agentstate.state.v1.StateServiceGrpc;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.MetadataUtils;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;

public final class AgentClient {
  static final String DOMAIN = "agentstate.io";
  static final Metadata.Key<String> USER_ID =
      Metadata.Key.of("agentstate-user-id", Metadata.ASCII_STRING_MARSHALLER);
  static final Metadata.Key<String> MISSING =
      Metadata.Key.of("agentstate-missing", Metadata.ASCII_STRING_MARSHALLER);

  final List<String> failures = new ArrayList<>();
  final Map<String, Object> out = new LinkedHashMap<>();

  void expect(boolean condition, String message) {
    if (!condition) {
      failures.add(message);
    }
  }

  /** The events of one streamed turn, or the status that ended it. */
  static final class Turn {
    final List<TurnEvent> events = new ArrayList<>();
    Status.Code code = Status.Code.OK;
    StatusRuntimeException error;

    List<String> kinds() {
      List<String> kinds = new ArrayList<>();
      for (TurnEvent e : events) {
        kinds.add(e.getEventCase().name().toLowerCase());
      }
      return kinds;
    }

    String reply() {
      StringBuilder text = new StringBuilder();
      for (TurnEvent e : events) {
        if (e.hasMessage()
            && e.getMessage().getType() == io.agentstate.agent.v1.MessageType.MESSAGE_TYPE_RESPONSE) {
          text.append(e.getMessage().getDelta());
        }
      }
      return text.toString();
    }

    TurnEvent first(TurnEvent.EventCase kind) {
      for (TurnEvent e : events) {
        if (e.getEventCase() == kind) {
          return e;
        }
      }
      return null;
    }
  }

  static Turn read(Iterator<? extends com.google.protobuf.Message> stream) {
    Turn turn = new Turn();
    try {
      while (stream.hasNext()) {
        com.google.protobuf.Message response = stream.next();
        turn.events.add(
            (TurnEvent) response.getField(response.getDescriptorForType().findFieldByName("event")));
      }
    } catch (StatusRuntimeException e) {
      turn.code = e.getStatus().getCode();
      turn.error = e;
    }
    return turn;
  }

  /**
   * Records a failed call the way a Java caller sees it: code, message, the agentstate-*
   * trailers and the ErrorInfo detail (StatusProto reads grpc-status-details-bin).
   */
  Map<String, Object> failed(String what, Status.Code expected, StatusRuntimeException error) {
    Map<String, Object> seen = new LinkedHashMap<>();
    if (error == null) {
      failures.add(what + ": expected " + expected + ", the call succeeded");
      out.put(what, seen);
      return seen;
    }
    seen.put("code", error.getStatus().getCode().name());
    seen.put("message", error.getStatus().getDescription());
    Metadata trailers = Status.trailersFromThrowable(error);
    if (trailers != null && trailers.get(MISSING) != null) {
      seen.put("trailer_missing", trailers.get(MISSING));
    }
    com.google.rpc.Status rich = StatusProto.fromThrowable(error);
    if (rich != null) {
      expect(rich.getCode() == error.getStatus().getCode().value(), what + ": details code differs");
      for (Any detail : rich.getDetailsList()) {
        if (detail.is(ErrorInfo.class)) {
          try {
            ErrorInfo info = detail.unpack(ErrorInfo.class);
            seen.put("reason", info.getReason());
            seen.put("domain", info.getDomain());
            seen.put("metadata", new LinkedHashMap<>(info.getMetadataMap()));
          } catch (InvalidProtocolBufferException e) {
            failures.add(what + ": undecodable ErrorInfo: " + e);
          }
        }
      }
    }
    expect(
        error.getStatus().getCode() == expected,
        what + ": expected " + expected + ", got " + error.getStatus());
    expect(DOMAIN.equals(seen.get("domain")), what + ": no ErrorInfo of domain " + DOMAIN);
    out.put(what, seen);
    return seen;
  }

  StatusRuntimeException errorOf(Supplier<Object> call) {
    try {
      call.get();
      return null;
    } catch (StatusRuntimeException e) {
      return e;
    }
  }

  static <S extends io.grpc.stub.AbstractStub<S>> S as(S stub, String userId) {
    Metadata headers = new Metadata();
    headers.put(USER_ID, userId);
    return stub.withInterceptors(MetadataUtils.newAttachHeadersInterceptor(headers))
        .withDeadlineAfter(60, TimeUnit.SECONDS);
  }

  void run(String agentAddress, String stateAddress, String userId, String question, String config)
      throws Exception {
    // The project's service config (retries for the idempotent reads), as any Java caller
    // passes it: parsed JSON to defaultServiceConfig, and retries enabled.
    @SuppressWarnings("unchecked")
    Map<String, ?> serviceConfig = new Gson().fromJson(config, Map.class);
    ManagedChannel agentChannel =
        ManagedChannelBuilder.forTarget(agentAddress)
            .usePlaintext()
            .defaultServiceConfig(serviceConfig)
            .enableRetry()
            .build();
    ManagedChannel stateChannel =
        ManagedChannelBuilder.forTarget(stateAddress)
            .usePlaintext()
            .defaultServiceConfig(serviceConfig)
            .enableRetry()
            .build();
    try {
      AgentServiceGrpc.AgentServiceBlockingStub agent =
          AgentServiceGrpc.newBlockingStub(agentChannel);
      StateServiceGrpc.StateServiceBlockingStub state =
          StateServiceGrpc.newBlockingStub(stateChannel);
      drive(agent, state, userId, question);
    } finally {
      agentChannel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
      stateChannel.shutdownNow().awaitTermination(5, TimeUnit.SECONDS);
    }
  }

  void drive(
      AgentServiceGrpc.AgentServiceBlockingStub agent,
      StateServiceGrpc.StateServiceBlockingStub state,
      String userId,
      String question) {
    // No identity: UNAUTHENTICATED, before any event.
    Turn anonymous =
        read(
            agent
                .withDeadlineAfter(60, TimeUnit.SECONDS)
                .chat(ChatRequest.newBuilder().setQuestion(question).build()));
    expect(anonymous.events.isEmpty(), "an anonymous Chat streamed events");
    failed("anonymous_chat", Status.Code.UNAUTHENTICATED, anonymous.error);

    // 1-3: the question; the turn stops at the cancel_order confirmation card.
    Turn chat = read(as(agent, userId).chat(ChatRequest.newBuilder().setQuestion(question).build()));
    expect(chat.code == Status.Code.OK, "Chat ended with " + chat.code + ": " + chat.error);
    List<String> chatKinds = chat.kinds();
    out.put("chat_kinds", chatKinds);
    TurnEvent meta = chat.first(TurnEvent.EventCase.META);
    TurnEvent card = chat.first(TurnEvent.EventCase.CONFIRM);
    if (meta == null || card == null) {
      failures.add("Chat gave no meta or no confirmation card: " + chatKinds);
      return;
    }
    String conversationId = meta.getMeta().getConversationId();
    String cardId = card.getConfirm().getMessageId();
    out.put("conversation_id", conversationId);
    out.put("new_conversation", meta.getMeta().getNewConversation());
    out.put("card_message_id", cardId);
    expect(chatKinds.get(0).equals("meta"), "Chat did not start with meta");
    expect(
        chatKinds.subList(chatKinds.size() - 2, chatKinds.size()).equals(List.of("confirm", "done")),
        "Chat did not end with confirm, done: " + chatKinds);
    expect(card.getConfirm().getCallsCount() == 1, "the card has not exactly one call");
    String cardTool = card.getConfirm().getCalls(0).getToolName();
    JsonObject cardArguments =
        JsonParser.parseString(
                card.getConfirm().getCalls(0).getArgumentsJson().toString(StandardCharsets.UTF_8))
            .getAsJsonObject();
    out.put("card_tool", cardTool);
    out.put("card_order_no", cardArguments.get("orderNo").getAsString());
    expect(cardTool.equals("cancel_order"), "the card is for " + cardTool);
    expect(cardArguments.get("orderNo").getAsString().equals("88235"), "the card's order differs");

    // 4: Cancel pressed on the card: only the ids and approved=false travel.
    ConfirmRequest decline =
        ConfirmRequest.newBuilder()
            .setConversationId(conversationId)
            .setMessageId(cardId)
            .setApproved(false)
            .build();
    Turn confirm = read(as(agent, userId).confirm(decline));
    expect(confirm.code == Status.Code.OK, "Confirm ended with " + confirm.code + ": " + confirm.error);
    List<String> confirmKinds = confirm.kinds();
    out.put("confirm_kinds", confirmKinds);
    List<String> blockStatuses = new ArrayList<>();
    for (TurnEvent e : confirm.events) {
      if (e.hasBlock()) {
        blockStatuses.add(e.getBlock().getStatus().name());
      }
    }
    out.put("confirm_block_statuses", blockStatuses);
    expect(
        blockStatuses.equals(List.of(ToolCallStatus.TOOL_CALL_STATUS_DENIED.name())),
        "the declined call's block is not DENIED: " + blockStatuses);
    TurnEvent finish = confirm.first(TurnEvent.EventCase.FINISH);
    expect(
        finish != null && finish.getFinish().getStatus() == MessageStatus.MESSAGE_STATUS_NORMAL,
        "Confirm did not finish NORMAL");
    expect(
        confirmKinds.size() >= 2
            && confirmKinds.subList(confirmKinds.size() - 2, confirmKinds.size())
                .equals(List.of("finish", "done")),
        "Confirm did not end with finish, done: " + confirmKinds);
    String reply = confirm.reply();
    out.put("reply", reply);
    for (String expected : List.of("88235", "已支付待发货", "3378.00")) {
      expect(reply.contains(expected), "the reply does not mention " + expected);
    }

    // The same card again: already handled.
    Turn again = read(as(agent, userId).confirm(decline));
    expect(again.events.isEmpty(), "a repeated Confirm streamed events");
    Map<String, Object> handled =
        failed("confirm_again", Status.Code.FAILED_PRECONDITION, again.error);
    expect(
        String.valueOf(handled.get("message")).contains("already handled"),
        "a repeated Confirm did not say already handled: " + handled.get("message"));

    // Someone else: the conversation does not exist for them.
    String stranger = userId + "-stranger";
    Turn strangerConfirm = read(as(agent, stranger).confirm(decline));
    failed("stranger_confirm", Status.Code.NOT_FOUND, strangerConfirm.error);
    failed(
        "stranger_list_messages",
        Status.Code.NOT_FOUND,
        errorOf(
            () ->
                as(agent, stranger)
                    .listMessages(
                        io.agentstate.agent.v1.ListMessagesRequest.newBuilder()
                            .setConversationId(conversationId)
                            .build())));
    int strangersConversations =
        as(agent, stranger)
            .listConversations(ListConversationsRequest.getDefaultInstance())
            .getConversationsCount();
    expect(strangersConversations == 0, "a stranger lists conversations");

    // The stored context: the state service holds the 8 messages of the worked example.
    GetStateResponse stored =
        state
            .withDeadlineAfter(60, TimeUnit.SECONDS)
            .getState(
                GetStateRequest.newBuilder()
                    .setUserId(userId)
                    .setConversationId(conversationId)
                    .build());
    out.put("state_version", stored.getVersion());
    checkContext(stored.getPayload().toString(StandardCharsets.UTF_8));
    failed(
        "stranger_get_state",
        Status.Code.NOT_FOUND,
        errorOf(
            () ->
                state
                    .withDeadlineAfter(60, TimeUnit.SECONDS)
                    .getState(
                        GetStateRequest.newBuilder()
                            .setUserId(stranger)
                            .setConversationId(conversationId)
                            .build())));
  }

  /** Each message as "ROLE: block block ..."; tool blocks as "tool_use NAME STATE". */
  void checkContext(String payload) {
    JsonArray context = JsonParser.parseString(payload).getAsJsonObject().getAsJsonArray("context");
    List<String> summary = new ArrayList<>();
    String askingId = null;
    String deniedId = null;
    for (JsonElement element : context) {
      JsonObject message = element.getAsJsonObject();
      List<String> blocks = new ArrayList<>();
      for (JsonElement b : message.getAsJsonArray("content")) {
        JsonObject block = b.getAsJsonObject();
        String type = block.get("type").getAsString();
        if (type.equals("tool_use") || type.equals("tool_result")) {
          String name = block.get("name").getAsString();
          String state = block.get("state").getAsString();
          blocks.add(type + " " + name + " " + state);
          if (name.equals("cancel_order") && type.equals("tool_use") && state.equals("asking")) {
            askingId = block.get("id").getAsString();
          }
          if (name.equals("cancel_order") && type.equals("tool_result") && state.equals("denied")) {
            deniedId = block.get("id").getAsString();
          }
        } else {
          blocks.add(type);
        }
      }
      summary.add(message.get("role").getAsString() + ": " + String.join(" ", blocks));
    }
    out.put("context", summary);
    out.put("cancel_call_id", askingId);
    List<String> expected =
        List.of(
            "USER: text",
            "ASSISTANT: thinking text tool_use load_skill allowed",
            "TOOL: tool_result load_skill success",
            "ASSISTANT: thinking tool_use query_order allowed",
            "TOOL: tool_result query_order success",
            "ASSISTANT: thinking text tool_use cancel_order asking",
            "TOOL: tool_result cancel_order denied",
            "ASSISTANT: thinking text");
    expect(summary.equals(expected), "the stored context is not the source's 8 messages: " + summary);
    expect(askingId != null && askingId.equals(deniedId), "the denial does not answer the call id");
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 5) {
      System.err.println(
          "usage: AgentClient AGENT_ADDRESS STATE_ADDRESS USER_ID QUESTION SERVICE_CONFIG_JSON");
      System.exit(64);
    }
    AgentClient client = new AgentClient();
    String config = Files.readString(Path.of(args[4]), StandardCharsets.UTF_8);
    client.run(args[0], args[1], args[2], args[3], config);
    client.out.put("failures", client.failures);
    Gson gson = new GsonBuilder().disableHtmlEscaping().serializeNulls().create();
    // UTF-8 whatever the locale: the reply is Chinese.
    PrintStream stdout = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
    stdout.println(gson.toJson(client.out));
    System.exit(client.failures.isEmpty() ? 0 : 1);
  }
}
