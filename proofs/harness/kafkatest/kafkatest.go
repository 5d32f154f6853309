// Package kafkatest gives tests a real Apache Kafka broker on 127.0.0.1,
// started with the project's own scripts/kafka-local (never a mock).
//
// Main(m) provides the shared broker of a test binary: the one named by
// FERRY_TEST_KAFKA (make test starts one for the whole run), or else one it
// starts on a free port for this package and stops afterwards. Tests that
// must stop or kill a broker start their own with Start. With -short,
// integration tests call SkipShort and do not need Java.
package kafkatest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

var shared string

// Runner is what Main runs: *testing.M, or a wrapper around it.
type Runner interface{ Run() int }

// Main runs the package's tests with a shared broker available.
func Main(m Runner) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	if addr := os.Getenv("FERRY_TEST_KAFKA"); addr != "" {
		shared = addr
		os.Exit(m.Run())
	}
	b, err := start(FreePort())
	if err != nil {
		fmt.Fprintln(os.Stderr, "kafkatest:", err)
		os.Exit(1)
	}
	shared = b.Addr
	code := m.Run()
	b.Stop()
	os.Exit(code)
}

// SkipShort skips an integration test under -short.
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test against real Kafka; skipped with -short")
	}
}

// Shared returns the shared broker's address.
func Shared(t testing.TB) string {
	t.Helper()
	SkipShort(t)
	if shared == "" {
		t.Fatal("kafkatest: no shared broker; call kafkatest.Main from TestMain")
	}
	return shared
}

// Broker is one kafka-local instance.
type Broker struct {
	Port int
	Addr string
}

func script() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "scripts", "kafka-local")
}

func (b *Broker) run(args ...string) error {
	cmd := exec.Command(script(), append(args, "--port", strconv.Itoa(b.Port))...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafka-local %v: %v\n%s", args, err, out)
	}
	return nil
}

func start(port int) (*Broker, error) {
	b := &Broker{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
	return b, b.run("start")
}

// Start starts a broker of the test's own on a free port; it is stopped and
// its data deleted when the test ends.
func Start(t testing.TB) *Broker {
	t.Helper()
	SkipShort(t)
	b, err := start(FreePort())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// Secure is a broker started with kafka-local --secure: PLAINTEXT at Addr
// (for the test's own admin and checks), SASL_SSL (PLAIN, SCRAM-SHA-256,
// SCRAM-SHA-512) at SASL and mTLS at MTLS, with the throw-away CA and the
// client certificate the script made; with SecureOptions.OAuthJWKS also
// SASL_SSL with OAUTHBEARER only at OAuth.
type Secure struct {
	*Broker
	SASL, MTLS                    string
	CAFile, ClientCert, ClientKey string
	User, Password                string
	OAuth                         string
}

// SecureOptions adds kafka-local's OAUTHBEARER listener (port+4): tokens
// signed by a key in the JWKS at OAuthJWKS (serving before the broker
// starts), issued by OAuthIssuer when set; ReauthMS is that listener's
// connections.max.reauth.ms (0: never re-authenticate).
type SecureOptions struct {
	OAuthJWKS, OAuthIssuer string
	ReauthMS               int
}

// StartSecure starts a secured broker of the test's own on free ports; it
// is stopped and its data deleted when the test ends.
func StartSecure(t testing.TB) *Secure {
	t.Helper()
	SkipShort(t)
	s, err := NewSecure()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// NewSecure starts a secured broker on free ports for a whole test binary
// (from TestMain); the caller stops it.
func NewSecure() (*Secure, error) { return NewSecureWith(SecureOptions{}) }

// NewSecureWith is NewSecure with the OAUTHBEARER listener of o.
func NewSecureWith(o SecureOptions) (*Secure, error) {
	var port int
	for i := 0; ; i++ {
		if port = FreePort(); free(port+2) && free(port+3) && (o.OAuthJWKS == "" || free(port+4)) {
			break
		}
		if i == 100 {
			return nil, errors.New("kafkatest: no free ports for the secured listeners")
		}
	}
	b := &Broker{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
	args := []string{"start", "--secure", "--port", strconv.Itoa(port)}
	if o.OAuthJWKS != "" {
		args = append(args, "--oauth-jwks", o.OAuthJWKS, "--reauth-ms", strconv.Itoa(o.ReauthMS))
		if o.OAuthIssuer != "" {
			args = append(args, "--oauth-issuer", o.OAuthIssuer)
		}
	}
	out, err := exec.Command(script(), args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		b.Stop()
		return nil, fmt.Errorf("kafka-local start --secure: %v\n%s%s", err, out, stderr)
	}
	env := map[string]string{}
	for _, line := range bytes.Split(out, []byte("\n")) {
		if k, v, ok := bytes.Cut(line, []byte("=")); ok {
			env[string(k)] = string(v)
		}
	}
	s := &Secure{Broker: b, SASL: env["KAFKA_SASL_SSL"], MTLS: env["KAFKA_MTLS"], CAFile: env["KAFKA_CA_FILE"],
		ClientCert: env["KAFKA_CLIENT_CERT"], ClientKey: env["KAFKA_CLIENT_KEY"], User: env["KAFKA_USER"], Password: env["KAFKA_PASSWORD"], OAuth: env["KAFKA_OAUTH"]}
	if s.SASL == "" || s.CAFile == "" || s.Password == "" || (o.OAuthJWKS != "" && s.OAuth == "") {
		b.Stop()
		return nil, fmt.Errorf("kafka-local start --secure printed no settings:\n%s", out)
	}
	return s, nil
}

// Cluster is a kafka-local cluster: KRaft nodes that are each a broker and
// a controller, replication factor 3 and min.insync.replicas 2.
type Cluster struct {
	Nodes   []*Broker // node i+1
	Brokers string    // every node's address, comma-separated
	// DiskMB is the size of each node's own data disk, 0 if the nodes
	// share the machine's (StartClusterDisks without root).
	DiskMB int
	// NoDisks says why DiskMB is 0 when disks were asked for.
	NoDisks string
}

// StartCluster starts n nodes on free ports; they are stopped and their
// data deleted when the test ends.
func StartCluster(t testing.TB, n int) *Cluster { return startCluster(t, n, 0, 0) }

// StartClusterDisks is StartCluster with a data disk of mb MiB per node
// (a tmpfs), so that Broker.Fill can run one broker out of space. Mounting
// needs root; without it the cluster shares the machine's disk and
// Cluster.NoDisks says so.
func StartClusterDisks(t testing.TB, n, mb int) *Cluster { return startCluster(t, n, mb, 0) }

// StartClusterAt is StartCluster on base port port (node i on
// port+2(i-1)), for runs that must keep to ports of their own (make soak);
// port 0 picks free ports.
func StartClusterAt(t testing.TB, n, port int) *Cluster { return startCluster(t, n, 0, port) }

func startCluster(t testing.TB, n, mb, port int) *Cluster {
	t.Helper()
	SkipShort(t)
	for i := 0; port == 0; i++ {
		port = FreePort()
		ok := true
		for p := port + 2; p < port+2*n; p++ {
			ok = ok && free(p)
		}
		if i == 100 && !ok {
			t.Fatalf("kafkatest: no %d free ports in a row", 2*n)
		}
		if !ok {
			port = 0
		}
	}
	c := &Cluster{}
	args := []string{"cluster", "start", "--brokers", strconv.Itoa(n), "--port", strconv.Itoa(port)}
	if mb > 0 && os.Geteuid() != 0 {
		c.NoDisks = "a data disk per broker is a tmpfs, and mounting one needs root"
	} else if mb > 0 {
		c.DiskMB = mb
		args = append(args, "--disk-mb", strconv.Itoa(mb))
	}
	for i := 0; i < n; i++ {
		p := port + 2*i
		c.Nodes = append(c.Nodes, &Broker{Port: p, Addr: "127.0.0.1:" + strconv.Itoa(p)})
		if i > 0 {
			c.Brokers += ","
		}
		c.Brokers += c.Nodes[i].Addr
	}
	out, err := exec.Command(script(), args...).CombinedOutput()
	t.Cleanup(func() {
		_ = exec.Command(script(), "cluster", "stop", "--brokers", strconv.Itoa(n), "--port", strconv.Itoa(port)).Run()
	})
	if err != nil {
		t.Fatalf("kafka-local cluster start: %v\n%s", err, out)
	}
	return c
}

// Node returns the node with Kafka node id id (1-based).
func (c *Cluster) Node(id int32) *Broker { return c.Nodes[id-1] }

// Pause stops the broker's process (SIGSTOP): alive, silent.
func (b *Broker) Pause(t testing.TB) {
	t.Helper()
	b.must(t, "pause")
}

// Resume continues a paused broker (SIGCONT).
func (b *Broker) Resume(t testing.TB) {
	t.Helper()
	b.must(t, "resume")
}

// Leader is the node id leading partition p of topic.
func Leader(t testing.TB, brokers, topic string, p int32) int32 {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	pd, ok := md.Topics[topic].Partitions[p]
	if !ok {
		t.Fatalf("no partition %d of %s in metadata", p, topic)
	}
	return pd.Leader
}

// Fill takes every free byte of the broker's own data disk
// (StartClusterDisks), as a full disk would.
func (b *Broker) Fill(t testing.TB) {
	t.Helper()
	b.must(t, "fill")
}

// Running says whether the broker's process is alive.
func (b *Broker) Running() bool { return b.run("status") == nil }

// Unfill frees what Fill took.
func (b *Broker) Unfill(t testing.TB) {
	t.Helper()
	b.must(t, "unfill")
}

// must runs a kafka-local command on this broker and fails the test if it
// fails.
func (b *Broker) must(t testing.TB, args ...string) {
	t.Helper()
	if err := b.run(args...); err != nil {
		t.Fatal(err)
	}
}

// Stop stops the broker and deletes its data.
func (b *Broker) Stop() { _ = b.run("stop") }

// Kill sends SIGKILL and keeps the data, as a crash would.
func (b *Broker) Kill(t testing.TB) {
	t.Helper()
	b.must(t, "kill")
}

// Restart starts a killed broker again on its kept data.
func (b *Broker) Restart(t testing.TB) {
	t.Helper()
	b.must(t, "start", "--keep-data")
}

// FreePort finds a port p such that p and p+1 (the controller) are free.
func FreePort() int {
	// Below the kernel's ephemeral range (32768-60999 by default): a port
	// from that range can be taken by any outgoing connection between the
	// check and a broker (re)starting on it, which made start-ups fail now
	// and then under a busy test run.
	for i := 0; i < 200; i++ {
		p := 20000 + 2*rand.IntN(6000)
		if free(p) && free(p+1) {
			return p
		}
	}
	panic("kafkatest: no free port pair")
}

func free(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// NewTopic creates a topic named prefix plus a unique suffix (so reruns on a
// shared broker do not collide) and returns its name.
func NewTopic(t testing.TB, brokers, prefix string, partitions int) string {
	t.Helper()
	topic := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	CreateTopic(t, brokers, topic, partitions)
	return topic
}

// CreateTopic creates a topic with the brokers' default replication factor.
func CreateTopic(t testing.TB, brokers, topic string, partitions int) {
	t.Helper()
	createTopic(t, brokers, topic, partitions, false)
}

func createTopic(t testing.TB, brokers, topic string, partitions int, mayExist bool) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, int32(partitions), -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !(mayExist && errors.Is(err, kerr.TopicAlreadyExists)) {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	waitLeaders(t, cl, topic)
}

// waitLeaders waits until every partition of a new topic has a leader: a
// producer that asks before that retries only after its metadata min age
// (5 s in franz-go), which makes a test slow, not wrong.
func waitLeaders(t testing.TB, cl *kgo.Client, topic string) {
	t.Helper()
	adm := kadm.NewClient(cl)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		td, err := adm.ListTopics(context.Background(), topic)
		if err != nil || td[topic].Err != nil || len(td[topic].Partitions) == 0 {
			continue
		}
		ok := true
		for _, p := range td[topic].Partitions {
			ok = ok && p.Leader >= 0 && p.Err == nil
		}
		if ok {
			return
		}
	}
	t.Fatalf("topic %s has no leaders after 30 s", topic)
}

// Consume reads topic from the start until want records arrived or timeout
// passed, and returns what it read.
func Consume(t testing.TB, brokers, topic string, want int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	return ConsumeUntil(t, brokers, topic, func(rs []*kgo.Record) bool { return len(rs) >= want }, timeout)
}

// ConsumeUntil reads topic from the start until enough(records so far)
// says so or timeout passed, then polls once more briefly (anything beyond,
// such as duplicates, is seen too), and returns what it read. For tests
// that know how many items, not records, to expect.
func ConsumeUntil(t testing.TB, brokers, topic string, enough func([]*kgo.Record) bool, timeout time.Duration) []*kgo.Record {
	t.Helper()
	cl := fromStart(t, brokers, topic)
	defer cl.Close()
	var out []*kgo.Record
	deadline := time.Now().Add(timeout)
	for !enough(out) && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { out = append(out, r) })
	cancel()
	return out
}

// TelemetrygenVersion is the OpenTelemetry load generator the tests use.
const TelemetrygenVersion = "v0.161.0"

// Telemetrygen returns the path of OpenTelemetry's telemetrygen, installing
// the pinned version into ferry's cache with go install if it is missing.
func Telemetrygen(t testing.TB) string {
	t.Helper()
	SkipShort(t)
	cache := os.Getenv("FERRY_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			t.Fatal(err)
		}
		cache = filepath.Join(base, "ferry")
	}
	bin := filepath.Join(cache, "telemetrygen-"+TelemetrygenVersion, "telemetrygen")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/open-telemetry/opentelemetry-collector-contrib/cmd/telemetrygen@"+TelemetrygenVersion)
	cmd.Env = append(os.Environ(), "GOBIN="+filepath.Dir(bin))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("installing telemetrygen: %v\n%s", err, out)
	}
	return bin
}

// ConsumeAll reads topic from the start until no record has arrived for idle
// (use when the expected number of records is not known, only of items).
func ConsumeAll(t testing.TB, brokers, topic string, idle time.Duration) []*kgo.Record {
	t.Helper()
	cl := fromStart(t, brokers, topic)
	defer cl.Close()
	var out []*kgo.Record
	for {
		ctx, cancel := context.WithTimeout(context.Background(), idle)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		if n == 0 {
			return out
		}
	}
}

// fromStart is a group-less consumer of topic from its first offset.
func fromStart(t testing.TB, brokers, topic string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// CreateTopicIfMissing creates a topic unless it exists already (topics
// with fixed names on a shared broker).
func CreateTopicIfMissing(t testing.TB, brokers, topic string, partitions int) {
	t.Helper()
	createTopic(t, brokers, topic, partitions, true)
}

// UpTo reads a single-partition topic from the start up to a marker record
// it produces first, so that everything written before the call is read
// however slow the broker is (up to timeout), and returns what came before
// the marker.
func UpTo(t testing.TB, brokers, topic string, timeout time.Duration) []*kgo.Record {
	t.Helper()
	marker := []byte(fmt.Sprintf("kafkatest-marker-%d", time.Now().UnixNano()))
	pcl, err := kgo.NewClient(kgo.SeedBrokers(brokers))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = pcl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: marker}).FirstErr()
	pcl.Close()
	if err != nil {
		t.Fatalf("marker to %s: %v", topic, err)
	}
	cl := fromStart(t, brokers, topic)
	defer cl.Close()
	var out []*kgo.Record
	for ctx.Err() == nil {
		found := false
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			switch {
			case found:
			case string(r.Value) == string(marker):
				found = true
			case !bytes.HasPrefix(r.Value, []byte("kafkatest-marker-")):
				out = append(out, r)
			}
		})
		if found {
			return out
		}
	}
	t.Fatalf("the marker did not come back from %s within %s", topic, timeout)
	return nil
}

// Batch is a Kafka record batch (magic v2) as a producer writes it, for
// tests that speak the protocol themselves.
type Batch struct {
	ProducerID int64 // -1: not idempotent (epoch and sequence are then -1 too)
	Epoch      int16
	Seq        int32
	Timestamp  time.Time   // of every record; zero: now. A retry must repeat it (it is under the CRC).
	Headers    [][2]string // on every record of Values
	Values     []string    // records with a null key and Headers
	// Records, when set, are the batch's records instead of Values.
	Records []Record
	// Attrs are the batch attributes besides the codec (transactional
	// 0x10, control 0x20); Codec compresses the records (zero: none).
	Attrs int16
	Codec kgo.CompressionCodec
}

// Record is one record of a Batch.
type Record struct {
	Key     []byte // nil: a null key
	Value   []byte
	Headers [][2]string
}

// Bytes encodes the batch: header, records (compressed with Codec),
// CRC-32C. It panics on a codec franz-go cannot write.
func (b Batch) Bytes() []byte {
	rs := b.Records
	if rs == nil {
		for _, v := range b.Values {
			rs = append(rs, Record{Value: []byte(v), Headers: b.Headers})
		}
	}
	var recs []byte
	for i, rec := range rs {
		var r []byte
		r = append(r, 0)                     // attributes
		r = binary.AppendVarint(r, 0)        // timestamp delta
		r = binary.AppendVarint(r, int64(i)) // offset delta
		if rec.Key == nil {
			r = binary.AppendVarint(r, -1)
		} else {
			r = binary.AppendVarint(r, int64(len(rec.Key)))
			r = append(r, rec.Key...)
		}
		r = binary.AppendVarint(r, int64(len(rec.Value)))
		r = append(r, rec.Value...)
		r = binary.AppendVarint(r, int64(len(rec.Headers)))
		for _, h := range rec.Headers {
			r = binary.AppendVarint(r, int64(len(h[0])))
			r = append(r, h[0]...)
			r = binary.AppendVarint(r, int64(len(h[1])))
			r = append(r, h[1]...)
		}
		recs = binary.AppendVarint(recs, int64(len(r)))
		recs = append(recs, r...)
	}
	attrs := b.Attrs
	if b.Codec != (kgo.CompressionCodec{}) {
		comp, err := kgo.DefaultCompressor(b.Codec)
		if err != nil {
			panic(err)
		}
		z, typ := comp.Compress(new(bytes.Buffer), recs)
		recs = bytes.Clone(z)
		attrs |= int16(typ)
	}
	ts := b.Timestamp
	if ts.IsZero() {
		ts = time.Now()
	}
	out := make([]byte, 61, 61+len(recs))
	binary.BigEndian.PutUint32(out[8:], uint32(49+len(recs)))
	out[16] = 2 // magic
	binary.BigEndian.PutUint16(out[21:], uint16(attrs))
	binary.BigEndian.PutUint32(out[23:], uint32(len(rs)-1))
	binary.BigEndian.PutUint64(out[27:], uint64(ts.UnixMilli()))
	binary.BigEndian.PutUint64(out[35:], uint64(ts.UnixMilli()))
	epoch, seq := b.Epoch, b.Seq
	if b.ProducerID < 0 {
		epoch, seq = -1, -1
	}
	binary.BigEndian.PutUint64(out[43:], uint64(b.ProducerID))
	binary.BigEndian.PutUint16(out[51:], uint16(epoch))
	binary.BigEndian.PutUint32(out[53:], uint32(seq))
	binary.BigEndian.PutUint32(out[57:], uint32(len(rs)))
	out = append(out, recs...)
	binary.BigEndian.PutUint32(out[17:], crc32.Checksum(out[21:], crc32.MakeTable(crc32.Castagnoli)))
	return out
}

// ProduceRequest is a Produce v7 request (acks all) of one batch to
// topic's partition 0, for tests that speak the protocol themselves.
func ProduceRequest(topic string, batch []byte) *kmsg.ProduceRequest {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 7, -1, 30000
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = topic
	p := kmsg.NewProduceRequestTopicPartition()
	p.Records = batch
	tp.Partitions = append(tp.Partitions, p)
	req.Topics = append(req.Topics, tp)
	return req
}
