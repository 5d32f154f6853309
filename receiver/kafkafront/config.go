package kafkafront

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ferryhq/ferry/auth"
	"github.com/ferryhq/ferry/bytesize"
	"github.com/ferryhq/ferry/routing"
	"github.com/ferryhq/ferry/server"
)

// Config is the user configuration (YAML receivers.kafka).
type Config struct {
	Enabled bool `yaml:"enabled"`
	// Listen is the TCP address Kafka clients bootstrap from.
	Listen string `yaml:"listen"`
	// TLS when tls.cert_file is set (Kafka clients' security.protocol=SSL;
	// with client_ca_file, mTLS).
	TLS server.TLSConfig `yaml:"tls"`
	// Advertised is the host:port ferry names itself by in Metadata
	// answers ("": the bound listen address). Clients connect to what
	// they are told, so it must be reachable from them.
	Advertised string `yaml:"advertised"`
	// MaxRequestBytes bounds a request as sent (Kafka's
	// socket.request.max.bytes): a larger size prefix closes the
	// connection before anything is read.
	MaxRequestBytes bytesize.Size `yaml:"max_request_bytes"`
	// MaxDecompressedBytes bounds one produce request's record batches
	// after decompression, all partitions together; a compressed request
	// reserves it before decompressing, so a bomb costs at most this.
	MaxDecompressedBytes bytesize.Size `yaml:"max_decompressed_bytes"`
	// MaxRecords bounds the records of one produce request, and
	// MaxPartitions its topic-partitions (a topic with none counts as one),
	// checked before they are decoded.
	MaxRecords    int `yaml:"max_records_per_request"`
	MaxPartitions int `yaml:"max_partitions_per_request"`
	// MaxInflightBytes bounds the produce requests one connection has
	// sent and not had answered; past it ferry stops reading the
	// connection until answers go out (flow control, not refusal).
	MaxInflightBytes bytesize.Size `yaml:"max_inflight_bytes"`
	// MaxConnections bounds the connections open at once.
	MaxConnections int `yaml:"max_connections"`
	// IdleTimeout closes a connection that sends nothing for this long
	// while nothing of it is in flight (Kafka's connections.max.idle.ms).
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// BodyTimeout bounds reading a request once its size prefix arrived
	// (a produce request's memory is reserved by then).
	BodyTimeout time.Duration `yaml:"body_timeout"`
	// AckTimeout: a produce request Kafka has not answered for within
	// this is answered REQUEST_TIMED_OUT (keep it below the clients'
	// request.timeout.ms); its records stay queued and may be delivered.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// MetadataMaxAge is how long the real topics' partition counts are
	// reused before the cluster is asked again.
	MetadataMaxAge time.Duration `yaml:"metadata_max_age"`
	// Topics: the topic names clients may produce to, as globs; a token's
	// own topic pattern applies on top.
	Topics []string `yaml:"topics"`
	// Auth: the application token is the SASL PLAIN password (source
	// "sasl"); the user name is only logged.
	Auth auth.ReceiverConfig `yaml:"auth"`
}

// Validate names the first invalid field.
func (c *Config) Validate() error {
	if !c.Enabled {
		return nil
	}
	if c.Listen == "" {
		return errors.New("listen: empty")
	}
	if c.Advertised != "" {
		host, port, err := net.SplitHostPort(c.Advertised)
		if err != nil || host == "" {
			return fmt.Errorf("advertised: %q is not host:port", c.Advertised)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("advertised: port %q is not 1..65535", port)
		}
	}
	if err := c.TLS.Validate(); err != nil {
		return err
	}
	if c.MaxRequestBytes < 1024 || c.MaxRequestBytes > 1<<30 {
		return fmt.Errorf("max_request_bytes: %s is outside 1KiB..1GiB", c.MaxRequestBytes)
	}
	if c.MaxDecompressedBytes < c.MaxRequestBytes || c.MaxDecompressedBytes > 1<<30 {
		return fmt.Errorf("max_decompressed_bytes: %s is outside max_request_bytes (%s)..1GiB", c.MaxDecompressedBytes, c.MaxRequestBytes)
	}
	if c.MaxRecords < 1 {
		return fmt.Errorf("max_records_per_request: %d is below 1", c.MaxRecords)
	}
	if c.MaxPartitions < 1 {
		return fmt.Errorf("max_partitions_per_request: %d is below 1", c.MaxPartitions)
	}
	if c.MaxInflightBytes < c.MaxRequestBytes {
		return fmt.Errorf("max_inflight_bytes: %s is below max_request_bytes (%s): one request must fit", c.MaxInflightBytes, c.MaxRequestBytes)
	}
	if c.MaxConnections < 0 {
		return fmt.Errorf("max_connections: %d is negative", c.MaxConnections)
	}
	if c.IdleTimeout <= 0 {
		return errors.New("idle_timeout: must be positive")
	}
	if c.BodyTimeout < 100*time.Millisecond {
		return fmt.Errorf("body_timeout: %s is below 100ms", c.BodyTimeout)
	}
	if c.AckTimeout < 100*time.Millisecond {
		return fmt.Errorf("ack_timeout: %s is below 100ms", c.AckTimeout)
	}
	if c.MetadataMaxAge < time.Second {
		return fmt.Errorf("metadata_max_age: %s is below 1s", c.MetadataMaxAge)
	}
	if _, err := routing.NewAllow(c.Topics); err != nil {
		return err
	}
	if err := c.Auth.Validate(); err != nil {
		return fmt.Errorf("auth.%w", err)
	}
	for _, s := range c.Auth.Sources {
		if s != "sasl" {
			return fmt.Errorf("auth.sources: %q: the Kafka front takes its token from SASL PLAIN only (sasl)", s)
		}
	}
	return nil
}
