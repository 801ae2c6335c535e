// Reads one conversation with the project's service config, for the retry test.
//
//	retry_check ADDRESS CONVERSATION_ID USER_ID SERVICE_CONFIG_JSON_PATH
//
// tests/contract/test_xlang_clients.py serves it UNAVAILABLE a few times first: with the config the
// channel retries the read (grpc-go before 1.40, like Debian's 1.33, needs GRPC_GO_RETRY=on).
// Prints {"code": ..., "conversation_id": ...}; exits 1 unless the read succeeded.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	statev1 "agentstate.io/gen/go/agentstate/state/v1"
)

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: retry_check ADDRESS CONVERSATION_ID USER_ID SERVICE_CONFIG_JSON_PATH")
		os.Exit(64)
	}
	config, err := ioutil.ReadFile(os.Args[4])
	if err != nil {
		panic(err)
	}
	conn, err := grpc.Dial(os.Args[1], grpc.WithInsecure(), grpc.WithDefaultServiceConfig(string(config)))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	got, err := statev1.NewStateServiceClient(conn).GetConversation(ctx, &statev1.GetConversationRequest{
		UserId: os.Args[3], ConversationId: os.Args[2],
	})
	result := map[string]string{"code": status.Code(err).String()}
	if err == nil {
		result["conversation_id"] = got.Conversation.ConversationId
	}
	encoded, _ := json.Marshal(result)
	fmt.Println(string(encoded))
	if err != nil {
		os.Exit(1)
	}
}
