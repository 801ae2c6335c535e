// A Go reader of a LangGraph thread stored by the state service, for the cross-language
// tests (tests/contract/test_xlang_clients.py).
//
//	checkpoint_reader ADDRESS USER_ID THREAD_ID SERVICE_CONFIG_JSON_PATH
//
// A Python LangGraph graph wrote the thread through agentstate.integrations.langgraph; this
// program finds its conversation by the thread id (ResolveConversation without creating),
// reads the conversation and lists its checkpoints newest first, page by page. It prints one
// JSON object with what it saw (ids, parents, metadata, channel names) and exits 1 when a
// call failed. The checkpoint bytes are LangGraph's own serialization; the metadata is JSON.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"os"
	"sort"
	"time"

	"google.golang.org/grpc"

	statev1 "agentstate.io/gen/go/agentstate/state/v1"
)

type checkpoint struct {
	Namespace    string          `json:"namespace"`
	CheckpointID string          `json:"checkpoint_id"`
	ParentID     string          `json:"parent_checkpoint_id"`
	Metadata     json.RawMessage `json:"metadata"`
	Channels     []string        `json:"channels"`
	Writes       int             `json:"pending_writes"`
}

type report struct {
	ConversationID string       `json:"conversation_id"`
	ExternalKey    string       `json:"external_key"`
	Title          string       `json:"title"`
	Checkpoints    []checkpoint `json:"checkpoints"`
	Failures       []string     `json:"failures"`
}

func main() {
	out := report{Checkpoints: []checkpoint{}, Failures: []string{}}
	finish := func() {
		encoded, _ := json.Marshal(out)
		fmt.Println(string(encoded))
		if len(out.Failures) > 0 {
			os.Exit(1)
		}
		os.Exit(0)
	}
	must := func(what string, err error) {
		if err != nil {
			out.Failures = append(out.Failures, fmt.Sprintf("%s failed: %v", what, err))
			finish()
		}
	}
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: checkpoint_reader ADDRESS USER_ID THREAD_ID SERVICE_CONFIG_JSON_PATH")
		os.Exit(64)
	}
	address, user, thread, configPath := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	config, err := ioutil.ReadFile(configPath)
	must("reading the service config", err)
	conn, err := grpc.Dial(address, grpc.WithInsecure(), grpc.WithDefaultServiceConfig(string(config)))
	must("dial", err)
	defer conn.Close()
	client := statev1.NewStateServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	resolved, err := client.ResolveConversation(ctx, &statev1.ResolveConversationRequest{
		UserId: user, ExternalKey: thread, CreateIfMissing: false,
	})
	must("ResolveConversation", err)
	cid := resolved.Conversation.ConversationId
	got, err := client.GetConversation(ctx, &statev1.GetConversationRequest{UserId: user, ConversationId: cid})
	must("GetConversation", err)
	out.ConversationID, out.ExternalKey, out.Title = cid, got.Conversation.ExternalKey, got.Conversation.Title

	token := ""
	for {
		page, err := client.ListCheckpoints(ctx, &statev1.ListCheckpointsRequest{
			UserId: user, ConversationId: cid, PageSize: 2, PageToken: token,
		})
		must("ListCheckpoints", err)
		for _, c := range page.Checkpoints {
			channels := []string{}
			for name := range c.ChannelVersions {
				channels = append(channels, name)
			}
			sort.Strings(channels)
			out.Checkpoints = append(out.Checkpoints, checkpoint{
				Namespace: c.Namespace, CheckpointID: c.CheckpointId, ParentID: c.ParentCheckpointId,
				Metadata: json.RawMessage(c.MetadataJson), Channels: channels, Writes: len(c.PendingWrites),
			})
		}
		if page.NextPageToken == "" {
			break
		}
		token = page.NextPageToken
	}
	finish()
}
