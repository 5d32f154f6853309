package kafkaexporter

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/aws"
)

// The SigV4 computation below is written from AWS's Signature Version 4
// specification, not from franz-go's code, so the test checks the payload
// the brokers get against the spec.

func hmacSHA256(key []byte, s string) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(s))
	return h.Sum(nil)
}

// signingKey is kSigning = HMAC(HMAC(HMAC(HMAC("AWS4"+secret, date), region), service), "aws4_request").
func signingKey(secret, date, region, service string) []byte {
	k := hmacSHA256([]byte("AWS4"+secret), date)
	k = hmacSHA256(k, region)
	k = hmacSHA256(k, service)
	return hmacSHA256(k, "aws4_request")
}

// uriEncode is SigV4's UriEncode: every byte but A-Z a-z 0-9 - _ . ~ as %XY.
func uriEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// The signing-key derivation matches the worked example of AWS's SigV4
// documentation ("Examples of how to derive a signing key"), so the
// reference computation is itself checked.
func TestSigV4ReferenceKey(t *testing.T) {
	k := signingKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20120215", "us-east-1", "iam")
	if got := hex.EncodeToString(k); got != "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d" {
		t.Fatalf("kSigning %s", got)
	}
}

// The AWS_MSK_IAM payload ferry sends for fixed credentials: its fields
// are the ones aws-msk-iam-auth sends (version 2020_10_22, action
// kafka-cluster:Connect, region from the MSK host name) and its signature
// is the SigV4 presigned-GET signature for the time it states.
func TestMSKIAMPayloadSigned(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	os.WriteFile(secretFile, []byte("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY\n"), 0o600)
	c := AWSConfig{AccessKeyID: "AKIDEXAMPLE", SecretAccessKeyFile: secretFile, SessionToken: "IQoJb3JpZ2luX2VjE+/=token", UserAgent: "ferry-test"}
	host := "b-1.ferry.abc123.c2.kafka.eu-west-3.amazonaws.com"
	before := time.Now().UTC().Add(-time.Second)
	_, payload, err := aws.ManagedStreamingIAM(awsAuth(c)).Authenticate(context.Background(), host+":9098")
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]string
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatalf("%v: %s", err, payload)
	}
	ts, err := time.Parse("20060102T150405Z", p["x-amz-date"])
	if err != nil || ts.Before(before.Truncate(time.Second)) || ts.After(time.Now().UTC()) {
		t.Fatalf("x-amz-date %q (%v) is not now", p["x-amz-date"], err)
	}
	date := p["x-amz-date"][:8]
	scope := date + "/eu-west-3/kafka-cluster/aws4_request"
	want := map[string]string{
		"version": "2020_10_22", "host": host, "user-agent": "ferry-test", "action": "kafka-cluster:Connect",
		"x-amz-algorithm": "AWS4-HMAC-SHA256", "x-amz-credential": "AKIDEXAMPLE/" + scope, "x-amz-expires": "300",
		"x-amz-signedheaders": "host", "x-amz-security-token": "IQoJb3JpZ2luX2VjE+/=token",
	}
	for k, v := range want {
		if p[k] != v {
			t.Errorf("%s = %q, want %q", k, p[k], v)
		}
	}
	// The canonical request of a presigned GET / with every X-Amz-* query
	// parameter but the signature, sorted by encoded name.
	q := map[string]string{
		"Action": "kafka-cluster:Connect", "X-Amz-Algorithm": "AWS4-HMAC-SHA256", "X-Amz-Credential": "AKIDEXAMPLE/" + scope,
		"X-Amz-Date": p["x-amz-date"], "X-Amz-Expires": "300", "X-Amz-SignedHeaders": "host", "X-Amz-Security-Token": "IQoJb3JpZ2luX2VjE+/=token",
	}
	var pairs []string
	for k, v := range q {
		pairs = append(pairs, uriEncode(k)+"="+uriEncode(v))
	}
	sort.Strings(pairs)
	emptyHash := sha256.Sum256(nil)
	canonical := "GET\n/\n" + strings.Join(pairs, "&") + "\nhost:" + host + "\n\nhost\n" + hex.EncodeToString(emptyHash[:])
	crHash := sha256.Sum256([]byte(canonical))
	sts := "AWS4-HMAC-SHA256\n" + p["x-amz-date"] + "\n" + scope + "\n" + hex.EncodeToString(crHash[:])
	sig := hex.EncodeToString(hmacSHA256(signingKey("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", date, "eu-west-3", "kafka-cluster"), sts))
	if p["x-amz-signature"] != sig {
		t.Fatalf("signature %s, SigV4 gives %s\ncanonical request:\n%s", p["x-amz-signature"], sig, canonical)
	}
	if strings.Contains(string(payload), "EXAMPLEKEY") {
		t.Fatal("the secret key is in the payload")
	}
}

// Credentials: the configuration's, else the environment's, else the
// shared credentials file's profile; each read at every connection.
func TestMSKIAMCredentialChain(t *testing.T) {
	dir := t.TempDir()
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"} {
		t.Setenv(k, "")
	}
	creds := filepath.Join(dir, "credentials")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	var c AWSConfig
	if _, _, err := c.credentials(); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("no credentials anywhere: %v", err)
	}
	os.WriteFile(creds, []byte("[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = d\n\n[ferry]\n# comment\naws_access_key_id=AKIDFERRY\naws_secret_access_key=f\naws_session_token = tok\n"), 0o600)
	if a, from, err := c.credentials(); err != nil || a.AccessKey != "AKIDDEFAULT" || a.SecretKey != "d" || !strings.Contains(from, "[default]") {
		t.Fatalf("default profile: %+v %s %v", a, from, err)
	}
	t.Setenv("AWS_PROFILE", "ferry")
	if a, _, err := c.credentials(); err != nil || a.AccessKey != "AKIDFERRY" || a.SessionToken != "tok" {
		t.Fatalf("profile ferry: %+v %v", a, err)
	}
	t.Setenv("AWS_PROFILE", "none")
	if _, _, err := c.credentials(); err == nil || !strings.Contains(err.Error(), "profile [none]") {
		t.Fatalf("missing profile: %v", err)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
	if _, _, err := c.credentials(); err == nil || !strings.Contains(err.Error(), "AWS_SECRET_ACCESS_KEY") {
		t.Fatalf("id without secret: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "e")
	if a, from, err := c.credentials(); err != nil || a.AccessKey != "AKIDENV" || from != "the environment" {
		t.Fatalf("environment: %+v %v", a, err)
	}
	c = AWSConfig{AccessKeyID: "AKIDCFG", SecretAccessKey: "c"}
	if a, _, err := c.credentials(); err != nil || a.AccessKey != "AKIDCFG" || a.SecretKey != "c" {
		t.Fatalf("configuration: %+v %v", a, err)
	}
	// A credentials file is bounded before it is read whole.
	t.Setenv("AWS_ACCESS_KEY_ID", "")
	os.WriteFile(creds, []byte("[default]\n"+strings.Repeat("# x\n", maxCredentialsFile/4+1)), 0o600)
	if _, _, err := (&AWSConfig{}).credentials(); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("huge credentials file: %v", err)
	}
}

// Settings are checked before a connection: TLS is required, the region
// must be known, and a secret goes with an access key id.
func TestMSKIAMConfigChecked(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	cfg := defaults(t)
	cfg.SASL = SASLConfig{Mechanism: "AWS_MSK_IAM", AWSMSKIAM: AWSConfig{AccessKeyID: "AKID", SecretAccessKey: "x"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "needs tls.enabled") {
		t.Fatalf("without TLS: %v", err)
	}
	cfg.TLS.Enabled = true
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Brokers = []string{"kafka.internal:9098"}
	if err := cfg.CheckFiles(); err == nil || !strings.Contains(err.Error(), "set AWS_REGION") {
		t.Fatalf("no region: %v", err)
	}
	t.Setenv("AWS_REGION", "eu-west-3")
	if err := cfg.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	cfg.Brokers = []string{"b-1.x.y.c2.kafka.us-east-1.amazonaws.com:9098"}
	t.Setenv("AWS_REGION", "")
	if err := cfg.CheckFiles(); err != nil {
		t.Fatal(err)
	}
	for want, c := range map[string]AWSConfig{
		"without access_key_id":        {SecretAccessKey: "x"},
		"set one of secret_access_key": {AccessKeyID: "AKID"},
		"session_token_file, not both": {AccessKeyID: "AKID", SecretAccessKey: "x", SessionToken: "a", SessionTokenFile: "b"},
		"mechanism is not AWS_MSK_IAM": {AccessKeyID: "AKID", SecretAccessKey: "x"},
	} {
		s := SASLConfig{Mechanism: "AWS_MSK_IAM", AWSMSKIAM: c}
		if strings.Contains(want, "mechanism") {
			s.Mechanism = ""
		}
		if err := s.validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q, got %v", want, err)
		}
	}
}

// Credentials that cannot be read at a connection are a retryable error
// for franz-go: records wait for them as for an unreachable broker.
func TestMSKIAMMissingCredentialsRetried(t *testing.T) {
	for _, k := range []string{"AWS_ACCESS_KEY_ID", "AWS_PROFILE"} {
		t.Setenv(k, "")
	}
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	_, _, err := aws.ManagedStreamingIAM(awsAuth(AWSConfig{})).Authenticate(context.Background(), "b-1.x.y.c2.kafka.us-east-1.amazonaws.com:9098")
	if err == nil || !kgo.IsRetryableBrokerErr(err) || !strings.Contains(err.Error(), "no credentials") {
		t.Fatalf("%v (retryable %v)", err, kgo.IsRetryableBrokerErr(err))
	}
}
