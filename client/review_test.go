package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

// TestLongRequestIDRefusedForGood: a request id over 128 bytes is the
// client's mistake, like one with a space: the record must fail for good,
// promptly, and not break the connection for every other record in flight
// (the agent answers it malformed_frame and closes; the client reconnects
// and sends the same frame again).
func TestLongRequestIDRefusedForGood(t *testing.T) {
	_, sock := agent(t, spoolLike{}, nil)
	cl, err0 := client.New(client.Options{Addrs: []string{"unix:" + sock}, RequestIDs: true})
	if err0 != nil {
		t.Fatal(err0)
	}
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		if err := cl.Close(cctx); err != nil {
			t.Logf("close: %v", err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	t0 := time.Now()
	err := cl.ProduceSync(ctx, &client.Record{Topic: "t", Value: []byte("x"), RequestID: strings.Repeat("r", 129)})
	var fe *client.Error
	if !errorsAs(err, &fe) || fe.Retryable {
		t.Fatalf("after %v: %T %v", time.Since(t0), err, err)
	}
}
