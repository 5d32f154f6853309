//go:build !race && !lz4check

package kafkaexporter

// lz4Checked is off in the shipped binary: see lz4_checked.go.
const lz4Checked = false
