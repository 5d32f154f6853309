package kafkaexporter

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/record"
)

// TestPartitionsFollowTheProducer: partitions added to a topic are offered
// (to the Kafka front's clients, to the OTLP receiver's trace grouping) only
// once the Kafka client's producer partitions with them, so a record sent
// to a partition Partitions offered is never refused as an "invalid record
// partitioning choice" (it was: the producer refreshes its metadata every
// 5 minutes, Partitions asked the cluster afresh, and the records chosen
// beyond the producer's count failed permanently).
func TestPartitionsFollowTheProducer(t *testing.T) {
	e, c := readyExporter(t, testCfg(nil)) // topic t: 1 partition, one record produced
	count := func() int32 {
		t.Helper()
		infos, err := e.Partitions(context.Background(), []string{"t"})
		if err != nil || len(infos) != 1 {
			t.Fatal(infos, err)
		}
		return infos[0].Partitions
	}
	send := func(p int32) {
		t.Helper()
		rec := record.Record{Topic: "t", Value: []byte("chosen")}
		rec.SetPartition(p)
		b := &record.Batch{Records: []record.Record{rec}}
		done := make(chan error, 1)
		b.OnDone(func(err error) { done <- err })
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
		waitDone(t, done, 10*time.Second, "a record on the last partition offered")
	}
	if n := count(); n != 1 {
		t.Fatalf("%d partitions, want 1", n)
	}
	adm := kadm.NewClient(newAdminClient(t, c))
	if _, err := adm.CreatePartitions(context.Background(), 3, "t"); err != nil {
		t.Fatal(err)
	}
	// Every answer until the producer knows the new partitions is one it
	// can write to; the ask makes it refresh, so they come soon.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := count()
		if n < 1 || n > 4 {
			t.Fatalf("%d partitions offered", n)
		}
		send(n - 1)
		if n == 4 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d partitions offered 10 s after the topic got 4", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newAdminClient(t *testing.T, c interface{ ListenAddrs() []string }) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}
