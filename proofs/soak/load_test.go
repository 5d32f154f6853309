package soak

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry/client"
)

// The sources, by id (the first field of every record's value).
const (
	srcHTTP0 = iota
	srcHTTP1
	srcGo
	srcJavaSDK
	srcJavaKafka
	nSources
)

var sourceNames = [nSources]string{"http-0", "http-1", "go-client", "java-sdk", "java-kafka"}

// ledger is what one source offered and what the agent acknowledged.
type ledger struct {
	mu      sync.Mutex
	acked   []bool // by seq
	offered atomic.Int64
	ackedN  atomic.Int64
}

func (l *ledger) ack(seq int64) {
	l.mu.Lock()
	for int64(len(l.acked)) <= seq {
		l.acked = append(l.acked, false)
	}
	if !l.acked[seq] {
		l.acked[seq] = true
		l.ackedN.Add(1)
	}
	l.mu.Unlock()
}

func (l *ledger) isAcked(seq int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return seq < len(l.acked) && l.acked[seq]
}

// tokens hands the current application token to every source.
type tokens struct {
	cur  atomic.Pointer[string]
	file string // for the JVM, which polls it
	subs []func(string)
	mu   sync.Mutex
}

func (tk *tokens) get() string { return *tk.cur.Load() }

func (tk *tokens) set(tok string) error {
	tk.cur.Store(&tok)
	tmp := tk.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, tk.file); err != nil {
		return err
	}
	tk.mu.Lock()
	subs := tk.subs
	tk.mu.Unlock()
	for _, f := range subs {
		f(tok)
	}
	return nil
}

func (tk *tokens) subscribe(f func(string)) {
	tk.mu.Lock()
	tk.subs = append(tk.subs, f)
	tk.mu.Unlock()
}

func value(src int, seq int64, pad string) []byte {
	return fmt.Appendf(nil, "%d:%d:%s", src, seq, pad)
}

// httpLoad posts NDJSON batches of 10 at rate records per second until
// ctx ends, from 4 connections at once (a request waits for Kafka's
// acknowledgement in modes kafka and spill). An id is never reused: a
// request that got no answer may have landed.
func httpLoad(ctx context.Context, src int, l *ledger, addr, topic string, tk *tokens, rate int, pad string) {
	const batch, workers = 10, 4
	cl := &http.Client{Timeout: 40 * time.Second}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				seq := next.Add(batch) - batch
				if d := time.Until(start.Add(time.Duration(seq) * time.Second / time.Duration(rate))); d > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(d):
					}
				}
				var body []byte
				for i := int64(0); i < batch; i++ {
					body = append(append(body, value(src, seq+i, pad)...), '\n')
				}
				for o := l.offered.Load(); o < seq+batch && !l.offered.CompareAndSwap(o, seq+batch); o = l.offered.Load() {
				}
				req, _ := http.NewRequest("POST", "http://"+addr+"/v1/messages/"+topic, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/x-ndjson")
				req.Header.Set("Authorization", "Bearer "+tk.get())
				req.Header.Set("X-Ferry-Request-Id", fmt.Sprintf("soak-%d-%d", src, seq))
				res, err := cl.Do(req)
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode == 200 {
					for i := int64(0); i < batch; i++ {
						l.ack(seq + i)
					}
				} else if res.StatusCode >= 500 || res.StatusCode == 429 {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
}

// goLoad produces with ferry's Go client at rate records per second until
// ctx ends; a new token makes a new client (the old one finishes what it
// holds, up to 10 s), as a rollout would.
func goLoad(ctx context.Context, t *testing.T, l *ledger, addr, topic string, tk *tokens, rate int, pad string) {
	newClient := func(tok string) *client.Client {
		c, err := client.New(client.Options{Addrs: []string{"tcp:" + addr}, Token: tok, ClientName: "soak-go",
			MaxBlock: 2 * time.Second, RequestIDs: true, Linger: 5 * time.Millisecond})
		if err != nil {
			t.Errorf("client.New: %v", err)
			return nil
		}
		return c
	}
	cur := newClient(tk.get())
	if cur == nil {
		return
	}
	var mu sync.Mutex
	var closing sync.WaitGroup
	tk.subscribe(func(tok string) {
		c := newClient(tok)
		if c == nil {
			return
		}
		mu.Lock()
		old := cur
		cur = c
		mu.Unlock()
		closing.Add(1)
		go func() {
			defer closing.Done()
			cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = old.Close(cctx)
		}()
	})
	start := time.Now()
	var seq int64
	for ctx.Err() == nil {
		due := int64(time.Since(start).Seconds() * float64(rate))
		if seq >= due {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		s := seq
		seq++
		l.offered.Store(seq)
		mu.Lock()
		c := cur
		mu.Unlock()
		c.Produce(ctx, &client.Record{Topic: topic, Value: value(srcGo, s, pad), RequestID: fmt.Sprintf("soak-%d-b%d", srcGo, s/100)},
			func(_ *client.Record, err error) {
				if err == nil {
					l.ack(s)
				}
			})
	}
	mu.Lock()
	c := cur
	mu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = c.Close(cctx)
	closing.Wait()
}

// javaLoad is the JVM running both Java producers (testdata/Soak.java).
type javaLoad struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	done   chan struct{}
	stderr bytes.Buffer
	ended  bool // printed "done"
}

func startJava(t *testing.T, cp, sdkAddr, kafkaAddr, topic, tokenFile string, rate, size int, ledgers []*ledger) *javaLoad {
	t.Helper()
	j := &javaLoad{done: make(chan struct{})}
	j.cmd = exec.Command("java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", cp, "Soak",
		"--sdk", "tcp:"+sdkAddr, "--kafka", kafkaAddr, "--topic", topic, "--token-file", tokenFile,
		"--rate", strconv.Itoa(rate), "--size", strconv.Itoa(size),
		"--sdk-src", strconv.Itoa(srcJavaSDK), "--kafka-src", strconv.Itoa(srcJavaKafka))
	j.cmd.Stderr = &j.stderr
	var err error
	if j.stdin, err = j.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := j.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.cmd.Start(); err != nil {
		t.Fatalf("java: %v", err)
	}
	t.Cleanup(func() { _ = j.cmd.Process.Kill() })
	go func() {
		defer close(j.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 1 && f[0] == "done" {
				j.ended = true
				continue
			}
			if len(f) != 3 {
				continue
			}
			src, err1 := strconv.Atoi(f[1])
			n, err2 := strconv.ParseInt(f[2], 10, 64)
			if err1 != nil || err2 != nil || src < 0 || src >= len(ledgers) {
				continue
			}
			switch f[0] {
			case "A":
				ledgers[src].ack(n)
				if n >= ledgers[src].offered.Load() {
					ledgers[src].offered.Store(n + 1)
				}
			case "O":
				ledgers[src].offered.Store(n)
			}
		}
	}()
	return j
}

// stop asks the JVM to stop producing and waits until its producers
// finished (it gives them 20 s).
func (j *javaLoad) stop(t *testing.T) {
	t.Helper()
	_, _ = j.stdin.Write([]byte("stop\n"))
	select {
	case <-j.done:
	case <-time.After(60 * time.Second):
		t.Errorf("the Java producers did not stop within 60 s")
		_ = j.cmd.Process.Kill()
		<-j.done
	}
	_ = j.cmd.Wait()
	if e := j.stderr.String(); e != "" {
		t.Logf("the Java producers' log (tail):\n%s", tail(e))
	}
	if !j.ended {
		t.Errorf("the Java producers ended without their totals\n%s", tail(j.stderr.String()))
	}
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}
