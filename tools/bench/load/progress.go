package load

import (
	"bytes"
	"fmt"
	"os"
	"time"
)

// IsTTY reports whether f is a terminal, for a live progress bar.
func IsTTY(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Bar draws "[#####.....] done/total what  rate/s  elapsed  ETA" on one
// terminal line.
func Bar(done, total int64, what string, elapsed time.Duration, rate float64) string {
	const width = 24
	frac := 0.0
	if total > 0 {
		frac = min(1, float64(done)/float64(total))
	}
	filled := int(frac * width)
	eta := "?"
	if rate > 0 && total > 0 {
		eta = (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
	}
	return fmt.Sprintf("\r[%s%s] %s/%s %s  %s/s  %s  ETA %s   ", bytes.Repeat([]byte("#"), filled), bytes.Repeat([]byte("."), width-filled),
		Human(float64(done)), Human(float64(total)), what, Human(rate), elapsed.Round(time.Second), eta)
}

func Human(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}
