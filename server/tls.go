package server

// TLS on ferry's own listeners. Off unless cert_file is set; with
// client_ca_file, clients must present a certificate signed by it (mTLS).
// The certificate and the client CAs are read again at the handshake after
// their files change, so a renewed certificate needs no restart; if the
// new files cannot be read, the listener keeps the last good ones and logs.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ferryhq/ferry/tlsfiles"
)

// TLSConfig is a listener's TLS (the tls key of every listener).
type TLSConfig struct {
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ClientCAFile: PEM CAs a client certificate must chain to; set, a
	// client without one is refused at the handshake.
	ClientCAFile string `yaml:"client_ca_file"`
	// MinVersion: "1.2" or "1.3".
	MinVersion string `yaml:"min_version"`
}

// On reports whether the listener serves TLS.
func (c *TLSConfig) On() bool { return c.CertFile != "" }

// Validate names the first invalid field.
func (c *TLSConfig) Validate() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("tls.cert_file and tls.key_file: set both or neither")
	}
	if c.ClientCAFile != "" && !c.On() {
		return errors.New("tls.client_ca_file needs tls.cert_file and tls.key_file")
	}
	if _, err := tlsfiles.Version(c.MinVersion); err != nil {
		return fmt.Errorf("tls.%w", err)
	}
	return nil
}

// CheckFiles reads the listener's certificate, key and client CA as
// start-up does, so `ferry validate` finds a file that is missing or holds
// no certificate before `ferry run` does.
func (c *TLSConfig) CheckFiles() error {
	if !c.On() {
		return nil
	}
	_, err := tlsfiles.New(tlsfiles.Files{CA: c.ClientCAFile, CAKey: "client_ca_file", Cert: c.CertFile, Key: c.KeyFile, Prefix: "tls."})
	return err
}

// serverTLS is the tls.Config a listener serves protos (ALPN) with, its
// files read now (an error fails start-up) and again when they change.
func serverTLS(c TLSConfig, protos []string, name string, log *slog.Logger) (*tls.Config, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	files, err := tlsfiles.New(tlsfiles.Files{CA: c.ClientCAFile, CAKey: "client_ca_file", Cert: c.CertFile, Key: c.KeyFile, Prefix: "tls."})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	minV, _ := tlsfiles.Version(c.MinVersion)
	build := func(m *tlsfiles.Material) *tls.Config {
		conf := &tls.Config{MinVersion: minV, NextProtos: protos, Certificates: []tls.Certificate{*m.Cert}}
		if m.Pool != nil {
			conf.ClientCAs, conf.ClientAuth = m.Pool, tls.RequireAndVerifyClientCert
		}
		return conf
	}
	m, _ := files.Load()
	var (
		mu       sync.Mutex
		lastM    = m
		last     = build(m)
		lastWarn time.Time
	)
	return &tls.Config{
		MinVersion: minV,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m, err := files.Load()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if time.Since(lastWarn) > 30*time.Second {
					lastWarn = time.Now()
					log.Warn("TLS files unreadable; serving with the last good ones", "server", name, "err", err)
				}
				return last, nil
			}
			if m != lastM {
				last, lastM = build(m), m
			}
			return last, nil
		},
	}, nil
}
