//go:build !race && !lz4check

package lz4frame

// lz4Checked is off in the shipped binary: see lz4_checked.go.
const lz4Checked = false
