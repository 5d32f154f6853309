package report

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// Doc is a Markdown report being written, with its charts beside it.
type Doc struct {
	b strings.Builder
	// Out is where the report will be written; Charts the directory its
	// SVG charts go to (linked relative to Out).
	Out, Charts string
}

// String is the report so far.
func (d *Doc) String() string { return d.b.String() }

// H writes a second-level heading.
func (d *Doc) H(format string, a ...any) { fmt.Fprintf(&d.b, "\n## "+format+"\n\n", a...) }

// P writes a line.
func (d *Doc) P(format string, a ...any) { fmt.Fprintf(&d.b, format+"\n", a...) }

// Table writes a table: the first column left-aligned, the others right.
func (d *Doc) Table(head []string, rows [][]string) {
	d.P("| %s |", strings.Join(head, " | "))
	al := make([]string, len(head))
	for i := range al {
		al[i] = "---:"
		if i == 0 {
			al[i] = "---"
		}
	}
	d.P("|%s|", strings.Join(al, "|"))
	for _, r := range rows {
		d.P("| %s |", strings.Join(r, " | "))
	}
	d.P("")
}

// F0 is v rounded, with thousands separators; – when not measured.
func F0(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return Commas(int64(math.Round(v)))
}

// F1 is v with one decimal.
func F1(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// Ratio is a/b as "1.23×".
func Ratio(a, b float64) string {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "–"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64) + "×"
}

// Commas writes n with thousands separators.
func Commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Chart writes a bar chart as Charts/name and returns the Markdown that
// shows it ("" if it could not be written).
func (d *Doc) Chart(name, title, unit string, cats []string, ss []Series) string {
	return d.writeChart(name, title, BarChart(title, unit, cats, ss))
}

func (d *Doc) writeChart(name, title, svg string) string {
	if err := os.MkdirAll(d.Charts, 0o755); err != nil {
		return ""
	}
	path := filepath.Join(d.Charts, name)
	if err := os.WriteFile(path, []byte(svg), 0o644); err != nil {
		return ""
	}
	rel, err := filepath.Rel(filepath.Dir(d.Out), path)
	if err != nil {
		rel = path
	}
	return fmt.Sprintf("![%s](%s)\n", title, filepath.ToSlash(rel))
}

// Machine describes this machine: CPU, cores, memory, kernel, Go, Java.
func Machine() [][]string {
	cpu, mem, kernel := "unknown", "unknown", "unknown"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.Fields(v)[0], 64)
				mem = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = strings.TrimSpace(string(b))
	}
	java := "unknown"
	if out, err := exec.Command("java", "-version").CombinedOutput(); err == nil {
		java = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	return [][]string{{"CPU", cpu}, {"cores", strconv.Itoa(runtime.NumCPU())}, {"memory", mem},
		{"kernel", "Linux " + kernel}, {"Go", runtime.Version()}, {"Java", java}}
}

// MachineLine is Machine in one line: cores and CPU model.
func MachineLine() string {
	m := map[string]string{}
	for _, kv := range Machine() {
		m[kv[0]] = kv[1]
	}
	return fmt.Sprintf("%s cores, %s", m["cores"], m["CPU"])
}

// ReplaceSection rewrites the part of markdown file path between the
// lines begin and end (kept) with body: how the measuring commands (make
// faults, make hostile, ferry-bench fleet) put their tables into the docs.
func ReplaceSection(path, begin, end, body string) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := strings.Index(string(doc), begin), strings.Index(string(doc), end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %s … %s section", path, begin, end)
	}
	out := string(doc[:i]) + begin + "\n\n" + body + "\n" + string(doc[j:])
	return os.WriteFile(path, []byte(out), 0o644)
}
