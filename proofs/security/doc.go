// Package security holds the real-binary tests of ferry's connections to
// secured Kafka brokers: TLS with the brokers' CA, client certificates
// (mTLS), SASL PLAIN and SCRAM-SHA-256/512 with passwords from the
// environment or a file, and what happens when a password or a
// certificate is wrong: /readyz names the mechanism or the certificate
// problem, the agent stays up, records wait, and once the setting is fixed
// by a reload they all reach Kafka.
//
// The broker is a real one: scripts/kafka-local start --secure, with
// certificates made on the fly and SCRAM users created through the admin
// API. The code under test is exporter/kafkaexporter's security.go.
package security
