package kafkaexporter

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/twmb/franz-go/pkg/sasl/aws"
)

// AWSConfig is SASL AWS_MSK_IAM, Amazon MSK's IAM access control
// (exporter.kafka.sasl.aws_msk_iam): each connection is authenticated by a
// SigV4 signature made with AWS credentials (franz-go's sasl/aws, the same
// payload as Amazon's aws-msk-iam-auth for Java).
//
// The credentials are, first found: the ones set here; the environment's
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; the
// shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
// ~/.aws/credentials, profile AWS_PROFILE or "default"). Each is read
// again at every connection, so rotated temporary credentials apply to the
// next one. Not supported, because each would pull in the AWS SDK or a
// client of an AWS service: EC2 instance and ECS task roles (IMDS), EKS
// service-account roles (IRSA web identity), SSO and credential_process.
// Where those are the source, write the credentials to a file (or the
// environment) with the AWS CLI or a sidecar.
//
// The region is the one in the broker host names (MSK's always hold it),
// else AWS_REGION or AWS_DEFAULT_REGION.
type AWSConfig struct {
	AccessKeyID string `yaml:"access_key_id"`
	// SecretAccessKey, or SecretAccessKeyFile holding it (trailing
	// newline ignored).
	SecretAccessKey     Secret `yaml:"secret_access_key"`
	SecretAccessKeyFile string `yaml:"secret_access_key_file"`
	// SessionToken, or SessionTokenFile, for temporary credentials (STS).
	SessionToken     Secret `yaml:"session_token"`
	SessionTokenFile string `yaml:"session_token_file"`
	// UserAgent is sent to the broker (IAM policies can match
	// aws:UserAgent); empty: franz-go/<go version>/<hostname>.
	UserAgent string `yaml:"user_agent"`
}

func (c *AWSConfig) problems() []error {
	var errs []error
	set := c.SecretAccessKey != "" || c.SecretAccessKeyFile != "" || c.SessionToken != "" || c.SessionTokenFile != ""
	if c.AccessKeyID == "" {
		if set {
			errs = append(errs, errors.New("sasl.aws_msk_iam: a secret or session token is set without access_key_id"))
		}
		return errs
	}
	if (c.SecretAccessKey == "") == (c.SecretAccessKeyFile == "") {
		errs = append(errs, errors.New("sasl.aws_msk_iam: set one of secret_access_key and secret_access_key_file with access_key_id"))
	}
	if c.SessionToken != "" && c.SessionTokenFile != "" {
		errs = append(errs, errors.New("sasl.aws_msk_iam: set session_token or session_token_file, not both"))
	}
	return errs
}

// credentials are the AWS credentials as they are now, and where they
// came from (for errors; never the secret).
func (c *AWSConfig) credentials() (aws.Auth, string, error) {
	if c.AccessKeyID != "" {
		secret, err := readSecret(string(c.SecretAccessKey), c.SecretAccessKeyFile, "sasl.aws_msk_iam.secret_access_key_file")
		if err != nil {
			return aws.Auth{}, "", err
		}
		tok, err := readSecret(string(c.SessionToken), c.SessionTokenFile, "sasl.aws_msk_iam.session_token_file")
		if err != nil {
			return aws.Auth{}, "", err
		}
		return aws.Auth{AccessKey: c.AccessKeyID, SecretKey: secret, SessionToken: tok, UserAgent: c.UserAgent}, "sasl.aws_msk_iam", nil
	}
	if id := os.Getenv("AWS_ACCESS_KEY_ID"); id != "" {
		secret := os.Getenv("AWS_SECRET_ACCESS_KEY")
		if secret == "" {
			return aws.Auth{}, "", errors.New("AWS_MSK_IAM: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
		}
		return aws.Auth{AccessKey: id, SecretKey: secret, SessionToken: os.Getenv("AWS_SESSION_TOKEN"), UserAgent: c.UserAgent}, "the environment", nil
	}
	file := os.Getenv("AWS_SHARED_CREDENTIALS_FILE")
	if file == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return aws.Auth{}, "", errors.New("AWS_MSK_IAM: no credentials: sasl.aws_msk_iam and AWS_ACCESS_KEY_ID are not set, and there is no home directory for ~/.aws/credentials")
		}
		file = filepath.Join(home, ".aws", "credentials")
	}
	profile := os.Getenv("AWS_PROFILE")
	if profile == "" {
		profile = "default"
	}
	a, err := sharedCredentials(file, profile)
	if err != nil {
		return aws.Auth{}, "", err
	}
	a.UserAgent = c.UserAgent
	return a, fmt.Sprintf("%s [%s]", file, profile), nil
}

// maxCredentialsFile bounds what is read of a shared credentials file.
const maxCredentialsFile = 1 << 20

// sharedCredentials reads profile's keys from an AWS shared credentials
// file (INI: [profile], key = value).
func sharedCredentials(file, profile string) (aws.Auth, error) {
	f, err := os.Open(file)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return aws.Auth{}, fmt.Errorf("AWS_MSK_IAM: no credentials: sasl.aws_msk_iam.access_key_id and AWS_ACCESS_KEY_ID are not set, and %s does not exist", file)
		}
		return aws.Auth{}, fmt.Errorf("AWS_MSK_IAM: %w", err)
	}
	defer f.Close()
	var a aws.Auth
	in := false
	sc := bufio.NewScanner(&limitedReader{f, maxCredentialsFile})
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		if line[0] == '[' && strings.HasSuffix(line, "]") {
			in = strings.TrimSpace(line[1:len(line)-1]) == profile
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !in || !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "aws_access_key_id":
			a.AccessKey = strings.TrimSpace(v)
		case "aws_secret_access_key":
			a.SecretKey = strings.TrimSpace(v)
		case "aws_session_token":
			a.SessionToken = strings.TrimSpace(v)
		}
	}
	if err := sc.Err(); err != nil {
		return aws.Auth{}, fmt.Errorf("AWS_MSK_IAM: reading %s: %w", file, err)
	}
	if a.AccessKey == "" || a.SecretKey == "" {
		return aws.Auth{}, fmt.Errorf("AWS_MSK_IAM: %s has no aws_access_key_id and aws_secret_access_key in profile [%s]", file, profile)
	}
	return a, nil
}

// limitedReader fails past n bytes instead of ending quietly (a cut-off
// file would give wrong keys).
type limitedReader struct {
	f *os.File
	n int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("larger than %d bytes", maxCredentialsFile)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.f.Read(p)
	l.n -= int64(n)
	return n, err
}

// readSecret is inline, or the file's content now; "" when neither is set.
func readSecret(inline, file, key string) (string, error) {
	if file == "" {
		return inline, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", key, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("%s %s is empty", key, file)
	}
	return s, nil
}

// awsRegionKnown reports whether the region can be found for every broker:
// in its host name, or in the environment.
func awsRegionKnown(brokers []string) error {
	if os.Getenv("AWS_REGION") != "" || os.Getenv("AWS_DEFAULT_REGION") != "" {
		return nil
	}
	for _, b := range brokers {
		host := b
		if i := strings.LastIndexByte(b, ':'); i >= 0 {
			host = b[:i]
		}
		if !strings.Contains(host, ".amazonaws.com") && !strings.HasSuffix(host, ".c2s.ic.gov") && !strings.HasSuffix(host, ".sc2s.sgov.gov") {
			return fmt.Errorf("sasl: AWS_MSK_IAM signs for a region, and broker %q does not name one (MSK's host names do): set AWS_REGION", b)
		}
	}
	return nil
}

// awsAuth is the mechanism's credentials callback.
func awsAuth(c AWSConfig) func(context.Context) (aws.Auth, error) {
	return func(context.Context) (aws.Auth, error) {
		a, _, err := c.credentials()
		if err != nil {
			return a, noCredentials{err}
		}
		return a, nil
	}
}
