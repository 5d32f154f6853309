package operate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
	"github.com/ferryhq/ferry/status"
)

// The load: what every view must show.
const (
	billingRecords = 40 // 4 requests of 10, unlimited app
	shopRecords    = 30 // one request over the burst of 5: admitted whole, into debt
	shopLimited    = 15 // 3 requests of 5 refused while in debt
	tooLarge       = 3  // requests over max_request_bytes
	forged         = 2  // requests with a token that does not verify
	// Requests the receiver refused: too large, rate-limited, unauthenticated
	// (the forged tokens, whose reason the auth rows give).
	refused = tooLarge + shopLimited/5 + forged
)

// agent starts ferry with tokens required on HTTP, a rate-limit class of
// 0.1 record/s for app shop, and a 4 KiB request bound; it returns the
// agent and a token per app. The slow refill keeps shop in debt (25
// records over its burst: 250 s) for as long as the views are checked:
// at 1 record/s a loaded CI machine reached ferry top after the 25 s of
// debt were paid back, and its debt column read "-".
func agent(t *testing.T, brokers string, sets ...string) (*agenttest.Agent, map[string]string) {
	t.Helper()
	key, err := exec.Command(ferryBin, "token", "keygen").Output()
	if err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf(`
exporter: {kafka: {brokers: [%q]}}
auth:
  keys: [{id: 1, secret: %q, issue: true}]
rate_limits:
  classes: {small: {records_per_sec: 0.1, burst_records: 5}}
receivers:
  http: {max_request_bytes: 4KiB, auth: {mode: required}}
`, brokers, strings.TrimSpace(string(key)))
	a := agenttest.Start(t, ferryBin, yaml, sets...)
	tokens := map[string]string{}
	for app, class := range map[string]string{"shop": "small", "billing": ""} {
		args := []string{"token", "issue", "-c", a.Config, "--app", app, "--expires", "1h"}
		if class != "" {
			args = append(args, "--rate-class", class)
		}
		out, err := exec.Command(ferryBin, args...).Output()
		if err != nil {
			t.Fatalf("token issue: %v", err)
		}
		tokens[app] = strings.TrimSpace(string(out))
	}
	return a, tokens
}

func post(t *testing.T, a *agenttest.Agent, topic, token string, body []byte) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+a.HTTP+"/v1/messages/"+topic, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-ndjson")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

func lines(n int) []byte {
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, `{"n":%d}`+"\n", i)
	}
	return b.Bytes()
}

// load sends the known load and checks each answer.
func load(t *testing.T, a *agenttest.Agent, topic string, tokens map[string]string) {
	t.Helper()
	for i := 0; i < 4; i++ {
		if c := post(t, a, topic, tokens["billing"], lines(10)); c != 200 {
			t.Fatalf("billing request %d: %d", i, c)
		}
	}
	if c := post(t, a, topic, tokens["shop"], lines(shopRecords)); c != 200 {
		t.Fatalf("shop's first request (over its burst, on a full bucket): %d", c)
	}
	for i := 0; i < shopLimited/5; i++ {
		if c := post(t, a, topic, tokens["shop"], lines(5)); c != 429 {
			t.Fatalf("shop in debt, request %d: %d, want 429", i, c)
		}
	}
	big := bytes.Repeat([]byte("x"), 5000)
	for i := 0; i < tooLarge; i++ {
		if c := post(t, a, topic, tokens["billing"], big); c != 413 {
			t.Fatalf("too large: %d", c)
		}
	}
	// Another valid base64url character in the middle: the token decodes,
	// and its ciphertext fails authentication (forged, not malformed).
	bad := []byte(tokens["billing"])
	if bad[len(bad)/2] == 'A' {
		bad[len(bad)/2] = 'B'
	} else {
		bad[len(bad)/2] = 'A'
	}
	for i := 0; i < forged; i++ {
		if c := post(t, a, topic, string(bad), lines(1)); c != 401 {
			t.Fatalf("forged token: %d", c)
		}
	}
}

func report(t *testing.T, admin string) *status.Report {
	t.Helper()
	res, err := http.Get("http://" + admin + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var r status.Report
	if err := json.NewDecoder(res.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return &r
}

// settled waits until the sampler has seen every record acknowledged.
func settled(t *testing.T, admin string) *status.Report {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r := report(t, admin)
		if r.Totals.SentRecords.Total == billingRecords+shopRecords && r.Totals.RefusedRequests.Total == refused {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("the report never showed the load: %+v", r.Totals)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func refusal(r *status.Report, receiver, reason string) float64 {
	for _, x := range r.Refusals {
		if x.Receiver == receiver && x.Reason == reason {
			return x.Count.Total
		}
	}
	return -1
}

func app(r *status.Report, name string) status.AppRow {
	for _, x := range r.Apps {
		if x.App == name {
			return x
		}
	}
	return status.AppRow{App: "missing"}
}

// TestOperatorViews: one agent, one known load, three views of it.
func TestOperatorViews(t *testing.T) {
	brokers := kafkatest.Shared(t)
	topic := kafkatest.NewTopic(t, brokers, "operate", 1)
	a, tokens := agent(t, brokers)
	load(t, a, topic, tokens)
	r := settled(t, a.Admin)

	t.Run("json", func(t *testing.T) {
		if r.Totals.ReceivedRecords.Total != billingRecords+shopRecords {
			t.Errorf("received %v", r.Totals.ReceivedRecords.Total)
		}
		if len(r.Topics) != 1 || r.Topics[0].Topic != topic || r.Topics[0].In.Total != 70 || r.Topics[0].Out.Total != 70 {
			t.Errorf("topics %+v", r.Topics)
		}
		for _, want := range []struct {
			receiver, reason string
			n                float64
		}{{"http", "request_too_large", tooLarge}, {"http", "rate_limited", shopLimited / 5}, {"http", "unauthenticated", forged},
			{"auth", "forged", forged}} {
			if got := refusal(r, want.receiver, want.reason); got != want.n {
				t.Errorf("refusals %s/%s: %v, want %v (all: %+v)", want.receiver, want.reason, got, want.n, r.Refusals)
			}
		}
		shop, billing := app(r, "shop"), app(r, "billing")
		if shop.Records.Total != shopRecords || shop.RateLimited.Total != shopLimited || shop.DebtSeconds <= 0 {
			t.Errorf("shop %+v: want %d admitted, %d rate-limited, in debt", shop, shopRecords, shopLimited)
		}
		if billing.Records.Total != billingRecords || billing.RateLimited.Total != 0 || billing.DebtSeconds != 0 {
			t.Errorf("billing %+v", billing)
		}
		k := r.Kafka
		if k.Up == nil || !*k.Up || k.Connections < 1 {
			t.Errorf("kafka %+v", k)
		}
		// The quantiles need produce requests in the window (10 s); the
		// load was just sent.
		if k.ProduceP50Ms == nil || k.ProduceP99Ms == nil || *k.ProduceP99Ms < *k.ProduceP50Ms || k.ProduceRequests < 1 {
			t.Errorf("produce latency %v %v over %v requests", k.ProduceP50Ms, k.ProduceP99Ms, k.ProduceRequests)
		}
		if !r.Ready || r.Queue.LimitBytes <= 0 || r.Spool != nil {
			t.Errorf("ready %v queue %+v spool %+v", r.Ready, r.Queue, r.Spool)
		}
		if h := r.History; h == nil || len(h.Series["in_records_per_sec"]) < 2 {
			t.Errorf("history %+v", r.History)
		}
		// A web page that rebinds its DNS name to the agent still says its
		// own name: the status routes, like every admin route, refuse it.
		for _, path := range []string{"/status", "/"} {
			req, _ := http.NewRequest("GET", "http://"+a.Admin+path, nil)
			req.Host = "attacker.example:8089"
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("%s for Host attacker.example: %d", path, res.StatusCode)
			}
		}
	})

	t.Run("page", func(t *testing.T) { page(t, a.Admin, topic) })
	t.Run("top", func(t *testing.T) { top(t, a.Admin, topic) })
}

func chromium(t *testing.T) string {
	t.Helper()
	for _, c := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	t.Fatal("chromium is not installed: run scripts/chromium-local")
	return ""
}

// headless runs Debian's chromium on the page. --no-sandbox: Chromium's
// sandbox refuses to start as root (the test machines run as root); the
// page is our own, from loopback.
func headless(t *testing.T, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--hide-scrollbars", "--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, chromium(t), append(base, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, agenttest.Tail(stderr.String(), 3000))
	}
	return out
}

// text is the element's text in the dumped DOM: <tag id="ID" ...>TEXT<.
func text(dom, id string) string {
	m := regexp.MustCompile(`id="` + regexp.QuoteMeta(id) + `"[^>]*>([^<]*)<`).FindStringSubmatch(dom)
	if m == nil {
		return "<no element " + id + ">"
	}
	return m[1]
}

func page(t *testing.T, admin, topic string) {
	url := "http://" + admin + "/"
	// The DOM after the page's script ran and polled /status (virtual time
	// runs its one-second timer; data-polls counts the answers it rendered).
	dom := string(headless(t, "--virtual-time-budget=3500", "--dump-dom", url))
	for id, want := range map[string]string{"in-total": "70", "out-total": "70", "refused-total": "8", "dead-total": "0"} {
		if got := text(dom, id); got != want {
			t.Errorf("page #%s shows %q, want %q", id, got, want)
		}
	}
	m := regexp.MustCompile(`data-polls="(\d+)"`).FindStringSubmatch(dom)
	if m == nil || m[1] == "0" {
		t.Errorf("the page never rendered a poll of /status (data-polls %v)", m)
	}
	// Table cells: each refusal reason with its receiver and count, each
	// application with its numbers, the topic.
	cells := regexp.MustCompile(`<td>([^<]*)</td>`).FindAllStringSubmatch(dom, -1)
	var row []string
	for _, c := range cells {
		row = append(row, c[1])
	}
	all := strings.Join(row, "|")
	for _, want := range []string{
		"request_too_large|http|", "rate_limited|http|", "forged|auth|",
		topic + "|", "shop|", "billing|",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("page tables lack %q:\n%s", want, all)
		}
	}
	// shop: rec/s, records 30, rate-limited 15; billing: records 40.
	if !regexp.MustCompile(`shop\|[0-9.]+\|30\|15\|0\|0\|[0-9.]+ s`).MatchString(all) {
		t.Errorf("shop's row (30 admitted, 15 rate-limited, in debt) not on the page:\n%s", all)
	}
	if !regexp.MustCompile(`billing\|[0-9.]+\|40\|0\|`).MatchString(all) {
		t.Errorf("billing's row not on the page:\n%s", all)
	}
	if !strings.Contains(dom, "Kafka up") {
		t.Errorf("no Kafka up badge")
	}

	// A screenshot: a real image of the rendered page, not a blank one.
	shot := filepath.Join(t.TempDir(), "status.png")
	raw := screenshot(t, url, shot)
	checkImage(t, raw)
}

func screenshot(t *testing.T, url, shot string) []byte {
	t.Helper()
	headless(t, "--virtual-time-budget=3500", "--window-size=1280,860", "--screenshot="+shot, url)
	raw, err := os.ReadFile(shot)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// checkImage: a real image of the rendered page, not a blank one: ink,
// the charts' blue lines, the green badges.
func checkImage(t *testing.T, raw []byte) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	bd := img.Bounds()
	if bd.Dx() != 1280 || bd.Dy() != 860 {
		t.Fatalf("screenshot is %v", bd)
	}
	var ink, blue, green int
	for y := bd.Min.Y; y < bd.Max.Y; y++ {
		for x := bd.Min.X; x < bd.Max.X; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			r, g, b = r>>8, g>>8, b>>8
			if r < 200 || g < 200 || b < 200 {
				ink++
			}
			// By hue, not exact colour: the charts' 1.5 px lines are
			// antialiased into their white ground, so how many pixels
			// keep the exact stroke colour depends on where the points
			// fall (a fresh machine's run counted 199 exact-blue pixels).
			if b > r+60 && b > g+30 {
				blue++ // the in-rate, queue and latency lines, their keys
			}
			if g > r+40 && g > b+20 {
				green++ // the ready and Kafka badges, the out-rate line
			}
		}
	}
	total := bd.Dx() * bd.Dy()
	t.Logf("screenshot %d bytes: %.1f%% ink, %d blue and %d green pixels", len(raw), 100*float64(ink)/float64(total), blue, green)
	if ink < total/100 || ink > total/2 {
		t.Errorf("screenshot has %d of %d pixels of ink: blank or broken", ink, total)
	}
	if blue < 200 || green < 200 {
		t.Errorf("screenshot lacks the charts' lines or badges: %d blue, %d green pixels", blue, green)
	}
}

// tmux runs one command against a private tmux server.
type tmux struct {
	t      *testing.T
	socket string
}

func (x *tmux) run(args ...string) (string, error) {
	out, err := exec.Command("tmux", append([]string{"-L", x.socket}, args...)...).CombinedOutput()
	return string(out), err
}

func (x *tmux) must(args ...string) string {
	x.t.Helper()
	out, err := x.run(args...)
	if err != nil {
		x.t.Fatalf("tmux %v: %v\n%s", args, err, out)
	}
	return out
}

// screen waits until the pane shows every string in want.
func (x *tmux) screen(want ...string) string {
	x.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s := x.must("capture-pane", "-p", "-t", "top")
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(s, w)
		}
		if ok {
			return s
		}
		if time.Now().After(deadline) {
			x.t.Fatalf("the terminal never showed %q:\n%s", want, s)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func top(t *testing.T, admin, topic string) {
	if _, err := exec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed: run scripts/chromium-local")
	}
	x := &tmux{t: t, socket: "ferry-operate-" + strconv.Itoa(os.Getpid())}
	t.Cleanup(func() { _, _ = x.run("kill-server") })
	x.must("-u", "new-session", "-d", "-x", "120", "-y", "40", "-s", "top", "-e", "LANG=C.UTF-8",
		ferryBin+" top --admin "+admin)
	s := x.screen("APPLICATIONS", "total 70", "request_too_large", topic)
	t.Logf("ferry top at 120x40:\n%s", s)
	rows := map[string][]string{}
	for _, l := range strings.Split(s, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	// Columns: app rec/s records limited/s limited sampled filtered debt.
	if f := rows["shop"]; len(f) != 8 || f[2] != "30" || f[4] != "15" || !strings.HasSuffix(f[7], "s") {
		t.Errorf("shop's row: %q", f)
	}
	if f := rows["billing"]; len(f) != 8 || f[2] != "40" || f[4] != "0" || f[7] != "-" {
		t.Errorf("billing's row: %q", f)
	}
	// Columns: topic in/s out/s in out bytes/s-out dropped.
	if f := rows[topic]; len(f) < 6 || f[3] != "70" || f[4] != "70" {
		t.Errorf("topic's row: %q", f)
	}
	if f := rows["request_too_large"]; len(f) != 4 || f[1] != "http" || f[3] != "3" {
		t.Errorf("request_too_large's row: %q", f)
	}
	if f := rows["forged"]; len(f) != 4 || f[1] != "auth" || f[3] != "2" {
		t.Errorf("forged's row: %q", f)
	}

	// An 80x24 ssh terminal: the frame reflows to fit it.
	x.must("resize-window", "-t", "top", "-x", "80", "-y", "24")
	time.Sleep(1500 * time.Millisecond)
	s = x.screen("APPLICATIONS", "total 70")
	t.Logf("ferry top at 80x24:\n%s", s)
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if n := utf8.RuneCountInString(strings.TrimRight(l, " ")); n > 80 {
			t.Errorf("a line of %d columns at 80x24: %q", n, l)
		}
	}
	if n := strings.Count(strings.TrimRight(s, "\n"), "\n") + 1; n > 24 {
		t.Errorf("%d lines at 80x24", n)
	}

	// q quits: the session (whose only command is ferry top) ends.
	x.must("send-keys", "-t", "top", "q")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := x.run("has-session", "-t", "top"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ferry top still running 5 s after q:\n%s", x.must("capture-pane", "-p", "-t", "top"))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// --once: one plain frame, every row, for scripts.
	out, err := exec.Command(ferryBin, "top", "--once", "--width", "100", "--admin", admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "total 70") || strings.Contains(string(out), "\x1b") {
		t.Errorf("top --once: %v\n%s", err, out)
	}
}

// TestStatusPageScreenshot makes the README's pictures from a real run
// (make screenshot): a minute of varying load from two applications, some
// of it refused, through an agent with a spool, then the status page's
// screenshot and a `ferry top --once` frame. It runs only when
// FERRY_SCREENSHOT names the PNG to write (FERRY_TOP_CAPTURE the text).
func TestStatusPageScreenshot(t *testing.T) {
	out := os.Getenv("FERRY_SCREENSHOT")
	if out == "" {
		t.Skip("FERRY_SCREENSHOT is not set")
	}
	brokers := kafkatest.Shared(t)
	// Fixed names, as a reader's would be: this test has a broker of its own (make screenshot).
	topics := []string{"app-logs", "checkout-events"}
	for _, tp := range topics {
		kafkatest.CreateTopicIfMissing(t, brokers, tp, 1)
	}
	a, tokens := agent(t, brokers, "delivery.mode=spool", "delivery.spool.dir="+t.TempDir())
	// The load goes on while the pictures are taken, so they show it
	// flowing, not a quiet agent after it.
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		send := func(topic, token string, body []byte) {
			req, _ := http.NewRequest("POST", "http://"+a.HTTP+"/v1/messages/"+topic, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/x-ndjson")
			req.Header.Set("Authorization", "Bearer "+token)
			if res, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			// A rate that rises and falls, and a burst of refusals now and then.
			n := 5 + int(20*(1+math.Sin(float64(i)/8)))
			send(topics[0], tokens["billing"], lines(n))
			if i%3 == 0 {
				send(topics[1], tokens["billing"], lines(n/2))
			}
			if i%4 == 0 {
				send(topics[1], tokens["shop"], lines(3))
			}
			if i%25 == 10 {
				send(topics[0], tokens["billing"], bytes.Repeat([]byte("x"), 5000))
			}
		}
	}()
	defer func() { close(stop); <-done }()
	time.Sleep(70 * time.Second)
	raw := screenshot(t, "http://"+a.Admin+"/", filepath.Join(t.TempDir(), "status.png"))
	checkImage(t, raw)
	if err := os.WriteFile(out, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if capture := os.Getenv("FERRY_TOP_CAPTURE"); capture != "" {
		frame, err := exec.Command(ferryBin, "top", "--once", "--width", "100", "--admin", a.Admin).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, frame)
		}
		if err := os.WriteFile(capture, frame, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
