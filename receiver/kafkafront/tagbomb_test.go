package kafkafront

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ferryhq/ferry/receiver"
)

// TestTagCountBomb: a flexible request whose tagged-field count is 2^28,
// in five bytes. kmsg loops that many times even past the end of the body
// (seconds of CPU per request); the front walks the tags first and closes
// the connection at once, counted as malformed_request, for every API it
// decodes with kmsg.
func TestTagCountBomb(t *testing.T) {
	f := startFront(t, testConfig(), receiver.Env{})
	bomb := binary.AppendUvarint(nil, 1<<28)
	for _, c := range []struct {
		name     string
		key, ver int16
		body     []byte
	}{
		{"Metadata v12, the request's tags", 3, 12, append([]byte{1, 0, 0}, bomb...)}, // no topics, two bools
		{"Metadata v9, a topic's tags", 3, 9, append([]byte{2, 5, 'l', 'o', 'g', 's'}, bomb...)},
		{"ApiVersions v3", 18, 3, append([]byte{2, 'x', 2, '1'}, bomb...)},
		{"InitProducerId v4", 22, 4, append([]byte{0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, bomb...)},
		{"SaslAuthenticate v2", 36, 2, append([]byte{1}, bomb...)},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := f.refused("malformed_request")
			k := dial(t, f)
			start := time.Now()
			k.write(appendFrame(nil, c.key, c.ver, 1, true, c.body))
			k.closed()
			if d := time.Since(start); d > time.Second {
				t.Errorf("closed after %s: the tag count was looped over", d)
			}
			if got := f.refused("malformed_request"); got != before+1 {
				t.Errorf("malformed_request %v → %v, want +1", before, got)
			}
		})
	}
}
