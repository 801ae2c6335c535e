// A Go caller of the state service over TLS with a client certificate (mTLS), for the
// transport-security tests.
//
//	tls_check ADDRESS CA_FILE CERT_FILE KEY_FILE USER_ID CONVERSATION_ID
//
// Lists the user's conversations and reads one state; prints {"list": CODE, "listed": [...],
// "get_state": CODE, "reason": ErrorInfo reason, "details": ...}. The test asserts what
// the state service's policy allowed and refused.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io/ioutil"
	"os"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	statev1 "agentstate.io/gen/go/agentstate/state/v1"
)

func main() {
	if len(os.Args) != 7 {
		fmt.Fprintln(os.Stderr, "usage: tls_check ADDRESS CA CERT KEY USER_ID CONVERSATION_ID")
		os.Exit(64)
	}
	ca, err := ioutil.ReadFile(os.Args[2])
	if err != nil {
		panic(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		panic("no CA certificate in " + os.Args[2])
	}
	pair, err := tls.LoadX509KeyPair(os.Args[3], os.Args[4])
	if err != nil {
		panic(err)
	}
	creds := credentials.NewTLS(&tls.Config{
		RootCAs:      roots,
		Certificates: []tls.Certificate{pair},
		MinVersion:   tls.VersionTLS12,
	})
	conn, err := grpc.Dial(os.Args[1], grpc.WithTransportCredentials(creds))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := statev1.NewStateServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	result := map[string]interface{}{"failures": []string{}}
	listed, err := client.ListConversations(ctx, &statev1.ListConversationsRequest{UserId: os.Args[5]})
	result["list"] = status.Code(err).String()
	ids := []string{}
	if err == nil {
		for _, c := range listed.Conversations {
			ids = append(ids, c.ConversationId)
		}
	}
	result["listed"] = ids
	_, err = client.GetState(ctx, &statev1.GetStateRequest{UserId: os.Args[5], ConversationId: os.Args[6]})
	st := status.Convert(err)
	result["get_state"] = st.Code().String()
	result["details"] = st.Message()
	result["reason"] = ""
	for _, detail := range st.Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			result["reason"] = info.Reason
		}
	}
	encoded, _ := json.Marshal(result)
	fmt.Println(string(encoded))
}
