// Package security holds the real-binary tests of ferry's connections to
// secured Kafka brokers: TLS with the brokers' CA, client certificates
// (mTLS), SASL PLAIN and SCRAM-SHA-256/512 with passwords from the
// environment or a file, SASL OAUTHBEARER with tokens from an OAuth 2.0
// client-credentials grant, and what happens when a password, a client
// secret, a token or a certificate is wrong: /readyz names the mechanism
// or the certificate problem, the agent stays up, records wait, and once
// the setting is fixed by a reload they all reach Kafka. Short-lived
// tokens on a listener that re-authenticates (connections.max.reauth.ms)
// show tokens refreshed before they expire and connections re-authenticated
// in place while records flow.
//
// The broker is a real one: scripts/kafka-local start --secure, with
// certificates made on the fly and SCRAM users created through the admin
// API, and --oauth-jwks for an OAUTHBEARER listener that checks tokens with
// Kafka's own JWT validator against the JWKS of proofs/harness/oauthtest,
// started first. The code under test is exporter/kafkaexporter's
// security.go and oauth.go (AWS_MSK_IAM, which needs Amazon MSK, is tested
// without a broker there).
package security
