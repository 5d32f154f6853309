package security

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ferryhq/ferry/proofs/harness/agenttest"
	"github.com/ferryhq/ferry/proofs/harness/kafkatest"
)

// oauthYAML configures the agent for the broker's OAUTHBEARER listener,
// with tokens from the test's identity provider (HTTPS, its own CA) for
// client id, the secret in secretFile.
func oauthYAML(b *kafkatest.Secure, id, secretFile string) string {
	return fmt.Sprintf(`receivers:
  http:
    ack_timeout: 2m
exporter:
  kafka:
    brokers: [%s]
    tls: {enabled: true, ca_file: %s}
    sasl:
      mechanism: OAUTHBEARER
      oauthbearer:
        token_endpoint: %s
        client_id: %s
        client_secret_file: %s
        scope: kafka:produce
        ca_file: %s
`, b.OAuth, b.CAFile, idp.TokenURL, id, secretFile, idp.CAFile)
}

// noSecrets fails when the agent's output holds the client secret or a
// token (every JWT starts with the base64 of `{"`: "eyJ").
func noSecrets(t *testing.T, a *agenttest.Agent, secret string) {
	t.Helper()
	logs := a.Logs.String()
	if strings.Contains(logs, secret) || strings.Contains(logs, "eyJ") {
		t.Fatal("a client secret or a token appears in the agent's output")
	}
}

// OAUTHBEARER end to end: the real agent gets a token from the identity
// provider with the client-credentials grant, the broker checks it with
// Kafka's own JWT validator (signature against the JWKS, audience,
// issuer, expiry), and the records reach Kafka.
func TestOAuthBearerDelivers(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-oauth", 3)
	idp.AddClient("ferry-deliver", "deliver-secret", time.Hour)
	secret := writeFile(t, t.TempDir(), "secret", "deliver-secret\n")
	a := agenttest.Start(t, ferryBin, oauthYAML(b, "ferry-deliver", secret))
	waitReadyz(t, a, 200)
	if code, body := post(t, a, topic, "oauth", 500); code != 200 || !strings.Contains(body, `"accepted":500`) {
		t.Fatalf("answer %d %s", code, body)
	}
	if got := countTags(t, b.Addr, topic, 500); got["oauth"] != 500 {
		t.Fatalf("%v of 500 records in Kafka", got)
	}
	if n := idp.Requests("ferry-deliver"); n != 1 {
		t.Errorf("%d token requests for one agent within a token's lifetime, want 1", n)
	}
	if v := a.Metric(`ferry_exporter_kafka_oauth_token_requests_total{result="ok"}`); v != 1 {
		t.Errorf("token request metric %v, want 1", v)
	}
	a.Stop()
	noSecrets(t, a, "deliver-secret")
}

// A wrong client secret: /readyz quotes the provider's refusal and names
// the client and the settings to check, the agent stays up and records
// wait; once the secret file is fixed and the agent reloaded, they reach
// Kafka and the waiting request is answered.
func TestOAuthBearerWrongSecret(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-oauth-pw", 1)
	idp.AddClient("ferry-wrong", "right-secret", time.Hour)
	secret := writeFile(t, t.TempDir(), "secret", "not-the-secret")
	a := agenttest.Start(t, ferryBin, oauthYAML(b, "ferry-wrong", secret))
	body := waitReadyz(t, a, 503, "OAUTHBEARER", "invalid_client", "ferry-wrong", "client_id and the client secret")
	t.Logf("/readyz with a wrong client secret: %s", body)
	answered := make(chan string, 1)
	go func() {
		code, body := post(t, a, topic, "waited", 200)
		answered <- fmt.Sprint(code, " ", body)
	}()
	time.Sleep(2 * time.Second)
	select {
	case ans := <-answered:
		t.Fatalf("answered before Kafka could have the records: %s", ans)
	default:
	}
	refused := idp.Refused("ferry-wrong")
	if refused < 1 || refused > 12 {
		t.Errorf("%d refused token requests in the first seconds: want a few (backoff), not one per connection attempt", refused)
	}
	if err := os.WriteFile(secret, []byte("right-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	a.Reload()
	select {
	case ans := <-answered:
		if !strings.HasPrefix(ans, "200 ") {
			t.Fatalf("after the fix: %s", ans)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the waiting request was not answered after the secret was fixed")
	}
	waitReadyz(t, a, 200)
	if got := countTags(t, b.Addr, topic, 200); got["waited"] != 200 {
		t.Fatalf("%v of 200 records in Kafka", got)
	}
	if v := a.Metric(`ferry_exporter_kafka_oauth_token_requests_total{result="error"}`); v < 1 {
		t.Errorf("refused token requests not counted: %v", v)
	}
	a.Stop()
	noSecrets(t, a, "right-secret")
	noSecrets(t, a, "not-the-secret")
}

// Tokens that live 10 s on a listener that re-authenticates every 6 s
// (connections.max.reauth.ms) and no later than the token's expiry, with
// no clock skew allowed: records flow for 22 s (two token lifetimes and
// more) without a failed request or a lost record, the
// agent asks for new tokens before the old ones expire, and the
// connections re-authenticate in place.
func TestOAuthBearerRefreshAndReauth(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-oauth-reauth", 3)
	idp.AddClient("ferry-short", "short-secret", 10*time.Second)
	secret := writeFile(t, t.TempDir(), "secret", "short-secret")
	a := agenttest.Start(t, ferryBin, oauthYAML(b, "ferry-short", secret))
	waitReadyz(t, a, 200)
	start := time.Now()
	const perPost = 50
	var (
		mu    sync.Mutex
		posts int
		fails []string
	)
	for time.Since(start) < 22*time.Second {
		code, body := post(t, a, topic, "flow", perPost)
		mu.Lock()
		posts++
		if code != 200 {
			fails = append(fails, fmt.Sprint(code, " ", body))
		}
		mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
	if len(fails) > 0 {
		t.Fatalf("%d of %d requests failed while tokens rotated: %v", len(fails), posts, fails[0])
	}
	tokens := idp.Requests("ferry-short")
	auths := a.Metric("ferry_exporter_kafka_sasl_authentications_total")
	connects := a.Metric("ferry_exporter_kafka_connects_total")
	errs := a.Metric("ferry_exporter_errors_total")
	t.Logf("%d requests (%d records) in %v; %d tokens issued; %v SASL authentications on %v connections opened; %v broker errors",
		posts, posts*perPost, time.Since(start).Round(time.Second), tokens, auths, connects, errs)
	// 22 s of 10 s tokens refreshed at 75-80%: the first and two more.
	if tokens < 3 {
		t.Errorf("%d tokens issued in 22 s of 10 s tokens: not refreshed before expiry", tokens)
	}
	// One authentication per connection opened; the rest are the broker's
	// re-authentications of open connections (about every 6 s for a busy
	// one), which must have happened and must not have broken one.
	if auths-connects < 3 {
		t.Errorf("%v SASL authentications on %v connections in 22 s: the connections were not re-authenticated", auths, connects)
	}
	if errs != 0 {
		t.Errorf("%v broker connection or request errors while tokens rotated", errs)
	}
	// In place: the connections opened at start (produce, metadata) are
	// the ones still used. An agent that re-authenticated with an expired
	// token would be refused and reconnect with a fresh one (about ten
	// connections in this time): records would still arrive, late.
	if connects > 4 {
		t.Errorf("%v connections opened in 22 s: re-authentication failed and connections were replaced", connects)
	}
	if got := countTags(t, b.Addr, topic, posts*perPost); got["flow"] != posts*perPost {
		t.Fatalf("%v of %d records in Kafka", got, posts*perPost)
	}
	a.Stop()
	noSecrets(t, a, "short-secret")
}

// A token the broker refuses (issued for another audience): /readyz says
// the broker refused the token and names the client and the settings to
// check; the agent stays up.
func TestOAuthBearerTokenRefusedByBroker(t *testing.T) {
	b := secured(t)
	idp.AddClient("ferry-aud", "aud-secret", time.Hour)
	secret := writeFile(t, t.TempDir(), "secret", "aud-secret")
	a := agenttest.Start(t, ferryBin, oauthYAML(b, "ferry-aud", secret)+"        audience: not-kafka\n")
	body := waitReadyz(t, a, 503, "OAUTHBEARER", "broker refused the token", "ferry-aud", "audience")
	t.Logf("/readyz with a token for another audience: %s", body)
	time.Sleep(3 * time.Second)
	// The provider is not asked at every reconnection for a token the
	// broker will refuse again.
	if n := idp.Requests("ferry-aud"); n > 3 {
		t.Errorf("%d token requests in a few seconds of refusals", n)
	}
	a.Alive()
	a.Stop()
	noSecrets(t, a, "aud-secret")
}

// The identity provider down past the token's expiry (10 s tokens, down
// from 2 s to 14 s): the connections cannot re-authenticate, so records
// wait (none is failed), /readyz names the token endpoint, and when the
// provider is back every record reaches Kafka and every request is
// answered 200.
func TestOAuthBearerProviderOutage(t *testing.T) {
	b := secured(t)
	topic := kafkatest.NewTopic(t, b.Addr, "secure-oauth-outage", 3)
	idp.AddClient("ferry-outage", "outage-secret", 10*time.Second)
	secret := writeFile(t, t.TempDir(), "secret", "outage-secret")
	a := agenttest.Start(t, ferryBin, oauthYAML(b, "ferry-outage", secret))
	waitReadyz(t, a, 200)
	defer idp.SetDown(false)
	const perPost = 20
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		posts int
		fails []string
	)
	sawDown := false
	start := time.Now()
	for time.Since(start) < 16*time.Second {
		switch el := time.Since(start); {
		case el > 2*time.Second && el < 14*time.Second:
			idp.SetDown(true)
		default:
			idp.SetDown(false)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := post(t, a, topic, "outage", perPost)
			mu.Lock()
			defer mu.Unlock()
			posts++
			if code != 200 {
				fails = append(fails, fmt.Sprint(code, " ", body))
			}
		}()
		if el := time.Since(start); el > 12*time.Second && !sawDown {
			if code, body := readyz(t, a); code == 503 && strings.Contains(body, "unavailable") {
				sawDown = true
				t.Logf("/readyz during the outage: %s", body)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	idp.SetDown(false)
	wg.Wait()
	t.Logf("%d requests in %v, provider down from 2 s to 14 s; %d tokens issued", posts, time.Since(start).Round(time.Second), idp.Requests("ferry-outage"))
	if len(fails) > 0 {
		t.Fatalf("%d of %d requests failed during the provider's outage: %v", len(fails), posts, fails[0])
	}
	if !sawDown {
		t.Error("/readyz did not say the token endpoint was unavailable during the outage")
	}
	if got := countTags(t, b.Addr, topic, posts*perPost); got["outage"] != posts*perPost {
		t.Fatalf("%v of %d records in Kafka", got, posts*perPost)
	}
	a.Stop()
	noSecrets(t, a, "outage-secret")
}
