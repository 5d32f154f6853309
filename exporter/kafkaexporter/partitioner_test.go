package kafkaexporter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/consumer"
	"github.com/ferryhq/ferry/record"
)

// TestChosenPartitionWins: a record whose partition the client chose (the
// Kafka front) lands there whatever its key; the others are partitioned as
// configured; the offsets Kafka gave reach OnAcked; and a choice beyond the
// topic's partitions fails that record only.
func TestChosenPartitionWins(t *testing.T) {
	for _, part := range []string{"murmur2", "round_robin", "uniform_bytes"} {
		t.Run(part, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "t"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			cfg := testCfg(c.ListenAddrs())
			cfg.Partitioner = part
			e := newExporter(t, cfg, 64<<20)
			defer e.Shutdown(context.Background())
			// The OTLP receiver's count cache hears of the shrink (the
			// exporter.ShrinkWatcher), whatever the delivery mode.
			var shrunk atomic.Int64
			stopWatch := e.WatchShrink(func(topic string, partition int32) {
				if topic == "t" && partition == 9 {
					shrunk.Add(1)
				}
			})
			var recs []record.Record
			for i := range 200 {
				r := record.Record{Topic: "t", Key: []byte{byte(i)}, Value: []byte{byte(i)}}
				if i%2 == 0 {
					r.SetPartition(int32(i / 2 % 4))
				}
				recs = append(recs, r)
			}
			bad := record.Record{Topic: "t", Value: []byte("beyond")}
			bad.SetPartition(9)
			recs = append(recs, bad)
			b := &record.Batch{Records: recs}
			offsets := make([]int64, len(recs))
			for i := range offsets {
				offsets[i] = -1
			}
			b.OnAcked = func(i int, off int64) { offsets[i] = off }
			var mu sync.Mutex
			failed := map[int]bool{}
			var why error
			b.OnFailure = func(i int, err error) { mu.Lock(); failed[i], why = true, err; mu.Unlock() }
			done := make(chan error, 1)
			b.OnDone(func(err error) { done <- err })
			if err := e.Consume(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("batch never completed")
			}
			if len(failed) != 1 || !failed[len(recs)-1] {
				t.Fatalf("failed records %v, want only the one beyond the partitions", failed)
			}
			// Named (franz-go's text is matched: this fails if an upgrade
			// changes it), and retryable: the client's retry is placed anew.
			var re *consumer.RetryableError
			if !errors.As(why, &re) || consumer.Reason(why) != "partition_unknown" {
				t.Fatalf("the record beyond the partitions failed with %v (%s), want a retryable partition_unknown", why, consumer.Reason(why))
			}
			if n := shrunk.Load(); n != 1 {
				t.Fatalf("the shrink watcher heard of topic t %d times, want 1", n)
			}
			// Spooled, its placement is on disk: refused for good, so the
			// spool dead-letters it rather than holding it forever.
			sb := &record.Batch{Records: []record.Record{bad}, Spooled: true}
			sb.OnFailure = func(_ int, err error) { mu.Lock(); why = err; mu.Unlock() }
			sdone := make(chan error, 1)
			sb.OnDone(func(err error) { sdone <- err })
			if err := e.Consume(context.Background(), sb); err != nil {
				t.Fatal(err)
			}
			<-sdone
			var pe *consumer.PermanentError
			mu.Lock()
			if !errors.As(why, &pe) || consumer.Reason(why) != "partition_unknown" {
				t.Fatalf("a spooled record beyond the partitions failed with %v, want a permanent partition_unknown", why)
			}
			mu.Unlock()
			if n := shrunk.Load(); n != 2 {
				t.Fatalf("the shrink watcher heard of topic t %d times after the spooled record, want 2", n)
			}
			stopWatch()
			e.shrunk("t", 9)
			if n := shrunk.Load(); n != 2 {
				t.Fatal("a stopped watcher was still called")
			}
			cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The records nobody chose are keyed: murmur2 and uniform_bytes
			// (with keys) place each by the Java client's murmur2 of its key;
			// round_robin deals them out evenly.
			byKey := kgo.StickyKeyPartitioner(nil).ForTopic("t")
			perPartition := map[int32]int{}
			seen := map[int]bool{}
			for len(seen) < 200 && ctx.Err() == nil {
				cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
					i := int(r.Value[0])
					if seen[i] {
						t.Errorf("record %d read twice", i)
					}
					seen[i] = true
					switch {
					case i%2 == 0:
						if r.Partition != int32(i/2%4) {
							t.Errorf("record %d chose partition %d, landed in %d", i, i/2%4, r.Partition)
						}
					case part == "round_robin":
						perPartition[r.Partition]++
					default:
						if want := int32(byKey.Partition(&kgo.Record{Key: r.Key}, 4)); r.Partition != want {
							t.Errorf("%s: record %d (key %x) in partition %d, its key hashes to %d", part, i, r.Key, r.Partition, want)
						}
					}
					if offsets[i] != r.Offset {
						t.Errorf("record %d at offset %d, OnAcked said %d", i, r.Offset, offsets[i])
					}
				})
			}
			if len(seen) != 200 {
				t.Fatalf("%d of the 200 delivered records read back", len(seen))
			}
			if part == "round_robin" {
				for p := int32(0); p < 4; p++ {
					if perPartition[p] != 25 {
						t.Errorf("round_robin put %d of the 100 unchosen records in partition %d, want 25 each (%v)", perPartition[p], p, perPartition)
					}
				}
			}
		})
	}
}

// TestProducerCountOnlyFromWholeCounts: franz-go passes a partitioner every
// partition only for records that require consistency (chosen or keyed);
// for others, only the writable ones, fewer while a leader is missing.
// Only the former may set the count Partitions caps at.
func TestProducerCountOnlyFromWholeCounts(t *testing.T) {
	// (uniform_bytes is partitioned through PartitionByBackup, which calls
	// the same see.)
	for _, part := range []kgo.Partitioner{kgo.StickyKeyPartitioner(nil), kgo.RoundRobinPartitioner()} {
		seen := new(producerCounts)
		tp := chosenFirst(part, seen).ForTopic("t")
		chosen := &kgo.Record{Topic: "t", Partition: 1}
		tp.Partition(chosen, 6)
		if n := seen.get("t"); n != 6 {
			t.Fatalf("%T: after a chosen record of 6 partitions: %d", part, n)
		}
		tp.Partition(&kgo.Record{Topic: "t", Partition: -1}, 4) // unkeyed, 2 partitions not writable
		if n := seen.get("t"); n != 6 {
			t.Fatalf("%T: an unkeyed record over the 4 writable partitions set the count to %d", part, n)
		}
		// Keyed: the whole count under murmur2, not under round_robin
		// (which ignores keys, so franz-go passes the writable ones).
		tp.Partition(&kgo.Record{Topic: "t", Key: []byte("k"), Partition: -1}, 8)
		want := int32(8)
		if fmt.Sprintf("%T", part) == fmt.Sprintf("%T", kgo.RoundRobinPartitioner()) {
			want = 6
		}
		if n := seen.get("t"); n != want {
			t.Fatalf("%T: after a keyed record of 8 partitions: %d, want %d", part, n, want)
		}
		// A topic not seen yet takes the writable count as a lower bound
		// (a cap below the truth is safe), until a whole count comes.
		tu := chosenFirst(part, seen).ForTopic("u")
		tu.Partition(&kgo.Record{Topic: "u", Partition: -1}, 3)
		if n := seen.get("u"); n != 3 {
			t.Fatalf("%T: a first unkeyed record over 3 writable partitions: %d", part, n)
		}
		tu.Partition(&kgo.Record{Topic: "u", Partition: 0}, 5)
		if n := seen.get("u"); n != 5 {
			t.Fatalf("%T: then a chosen record of 5: %d", part, n)
		}
	}
}

// TestKeylessRecordsStick: keyless records handed over within one linger
// go to one partition, in one batch, as franz-go's sticky partitioner
// places them without ferry's wrapper. franz-go writes the partition it
// tried into the record before asking the partitioner again for a new
// batch; the wrapper once read that as the client's choice, so the sticky
// partitioner never picked again and every linger window opened batches
// on three to five partitions (a fleet's produce requests and batches
// multiplied by that, docs/scaling.md).
func TestKeylessRecordsStick(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(12, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cfg := testCfg(c.ListenAddrs())
	cfg.LingerMode, cfg.Linger = "fixed", 3*time.Second // every record below is handed over within it, even on a loaded machine
	e := newExporter(t, cfg, 64<<20)
	defer e.Shutdown(context.Background())
	const batches, each = 8, 10
	dones := make(chan error, batches)
	for i := range batches {
		var recs []record.Record
		for j := range each {
			recs = append(recs, record.Record{Topic: "t", Value: []byte{byte(i*each + j)}})
		}
		b := &record.Batch{Records: recs}
		b.OnDone(func(err error) { dones <- err })
		if err := e.Consume(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	for range batches {
		select {
		case err := <-dones:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a batch never completed")
		}
	}
	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	perPartition := map[int32]int{}
	for n := 0; n < batches*each && ctx.Err() == nil; {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { perPartition[r.Partition]++; n++ })
	}
	if len(perPartition) != 1 {
		t.Fatalf("%d keyless records handed over within one linger landed in %d partitions (%v), want one", batches*each, len(perPartition), perPartition)
	}
}

// TestAskedAgainAfterNewBatch: franz-go's second ask for a keyless record
// (after OnNewBatch, with the partition it tried written into the record)
// reaches the sticky partitioner, which moves on, and does not set the
// producer's count from the writable partitions; a chosen record asked
// again keeps its choice.
func TestAskedAgainAfterNewBatch(t *testing.T) {
	seen := new(producerCounts)
	tp := chosenFirst(kgo.StickyKeyPartitioner(nil), seen).ForTopic("t")
	nb, ok := tp.(kgo.TopicPartitionerOnNewBatch)
	if !ok {
		t.Fatal("the wrapper of the sticky partitioner lost OnNewBatch")
	}
	tp.Partition(&kgo.Record{Topic: "t", Partition: 1}, 6) // a chosen record: the whole count
	for range 100 {
		r := &kgo.Record{Topic: "t", Partition: -1}
		first := tp.Partition(r, 4) // 2 of 6 not writable
		r.Partition = int32(first)  // what franz-go's bufferRecord does before it gives up
		nb.OnNewBatch()
		if again := tp.Partition(r, 4); again == first {
			t.Fatalf("asked again after a new batch, the sticky partitioner stayed on partition %d", first)
		}
		if n := seen.get("t"); n != 6 {
			t.Fatalf("a keyless record asked again set the count to %d, want 6", n)
		}
		// The sticky partition holds for the next keyless record, and
		// through a batch a chosen record opens (the Kafka front writing
		// the same topic), as the Java client's sticky partitioner does.
		sticky := tp.Partition(&kgo.Record{Topic: "t", Partition: -1}, 4)
		c := &kgo.Record{Topic: "t", Partition: 5}
		tp.Partition(c, 6)
		nb.OnNewBatch()
		if got := tp.Partition(c, 6); got != 5 {
			t.Fatalf("a record that chose partition 5, asked again: %d", got)
		}
		if got := tp.Partition(&kgo.Record{Topic: "t", Partition: -1}, 4); got != sticky {
			t.Fatalf("a batch a chosen record opened moved the keyless records from partition %d to %d", sticky, got)
		}
	}
	// A second ask that never came lends its reading to no other record.
	c := &kgo.Record{Topic: "t", Partition: 3}
	tp.Partition(c, 6)
	nb.OnNewBatch()
	if got := tp.Partition(&kgo.Record{Topic: "t", Partition: -1}, 4); got < 0 || got >= 4 {
		t.Fatalf("a keyless record after an unanswered new batch was placed at %d", got)
	}
}
