// Reads an agent framework's session from Go: the items an OpenAI Agents SDK session (or
// an ADK session) wrote through the Python adapter, for the cross-language tests.
//
//	session_items ADDRESS USER_ID EXTERNAL_KEY
//
// It finds the conversation by its external key (ResolveConversation without creating),
// reads its items oldest first in pages (ListItems) and the newest one alone (last_n), and
// prints one JSON object: the conversation id, the items as stored, their seqs and the
// item revision. Exits 1 when a call fails or the answers disagree.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	statev1 "agentstate.io/gen/go/agentstate/state/v1"
)

type report struct {
	ConversationID string            `json:"conversation_id"`
	Items          []json.RawMessage `json:"items"`
	Seqs           []int64           `json:"seqs"`
	Revision       int64             `json:"revision"`
	Newest         json.RawMessage   `json:"newest"`
	Failures       []string          `json:"failures"`
}

func main() {
	out := report{Failures: []string{}, Items: []json.RawMessage{}, Seqs: []int64{}}
	finish := func() {
		encoded, _ := json.Marshal(out)
		fmt.Println(string(encoded))
		if len(out.Failures) > 0 {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: session_items ADDRESS USER_ID EXTERNAL_KEY")
		os.Exit(64)
	}
	address, user, key := os.Args[1], os.Args[2], os.Args[3]
	conn, err := grpc.Dial(address, grpc.WithInsecure())
	if err != nil {
		out.Failures = append(out.Failures, "dial: "+err.Error())
		finish()
	}
	defer conn.Close()
	client := statev1.NewStateServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	resolved, err := client.ResolveConversation(ctx, &statev1.ResolveConversationRequest{
		UserId: user, ExternalKey: key, CreateIfMissing: false,
	})
	if err != nil {
		out.Failures = append(out.Failures, "ResolveConversation: "+err.Error())
		finish()
	}
	cid := resolved.Conversation.ConversationId
	out.ConversationID = cid

	token := ""
	for {
		page, err := client.ListItems(ctx, &statev1.ListItemsRequest{
			UserId: user, ConversationId: cid, PageSize: 2, PageToken: token,
		})
		if err != nil {
			out.Failures = append(out.Failures, "ListItems: "+err.Error())
			finish()
		}
		for _, item := range page.Items {
			out.Items = append(out.Items, json.RawMessage(item.ItemJson))
			out.Seqs = append(out.Seqs, item.Seq)
		}
		out.Revision = page.Revision
		token = page.NextPageToken
		if token == "" {
			break
		}
	}
	newest, err := client.ListItems(ctx, &statev1.ListItemsRequest{
		UserId: user, ConversationId: cid, LastN: proto.Int32(1),
	})
	if err != nil {
		out.Failures = append(out.Failures, "ListItems last_n: "+err.Error())
		finish()
	}
	if len(newest.Items) != 1 || len(out.Items) == 0 || newest.Items[0].Seq != out.Seqs[len(out.Seqs)-1] {
		out.Failures = append(out.Failures, "last_n=1 did not return the newest item")
	} else {
		out.Newest = json.RawMessage(newest.Items[0].ItemJson)
	}
	finish()
}
