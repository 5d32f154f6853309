//go:build race || lz4check

package lz4frame

// Tests run with -race (make test) and the fuzz runs (-tags lz4check) check
// every load of the lz4 encoder against its slice's length, so a change
// that breaks the encoder's bounds panics there instead of reading past
// the batch.
const lz4Checked = true
