package filereceiver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/telemetry"
)

// fileMetrics are the files-specific metrics, besides the ferry_receiver_*
// ones every receiver shares. Labels are bounded: "group" is the include
// glob a file matched (the configuration's, not one per file), "reason" a
// fixed set.
type fileMetrics struct {
	open        prometheus.Gauge
	lines       *prometheus.CounterVec
	bytes       *prometheus.CounterVec
	watched     *prometheus.GaugeVec
	lag         *prometheus.GaugeVec
	rotations   *prometheus.CounterVec
	truncations *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	inflight    prometheus.Gauge
	checkpoints prometheus.Counter
	// compressedCopies: gzip files found to hold a file already read.
	compressedCopies prometheus.Counter
	// copies: copytruncate copies read from the truncated file's offset.
	copies prometheus.Counter
	// rotatedSince: files rotated since the checkpoint, unknown to it,
	// read at a restart.
	rotatedSince prometheus.Counter
}

func newFileMetrics(reg prometheus.Registerer) *fileMetrics {
	return &fileMetrics{
		open: telemetry.Shared(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_files_open_files",
			Help: "Files held open (max_open_files bounds it)."})),
		lines: telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_files_lines_total",
			Help: "Records (lines, or multiline events) handed to the pipeline, by include glob."}, []string{"group"})),
		bytes: telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_files_bytes_total",
			Help: "Bytes of those records (key and value), by include glob."}, []string{"group"})),
		watched: telemetry.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_files_watched_files",
			Help: "Files known (open or not), by include glob."}, []string{"group"})),
		lag: telemetry.Shared(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ferry_files_lag_bytes",
			Help: "Bytes of the files not yet committed (in Kafka, or the spool), by include glob; as of the last poll."}, []string{"group"})),
		rotations: telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_files_rotations_total",
			Help: "Files renamed or deleted while known (read on to their end), by include glob."}, []string{"group"})),
		truncations: telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_files_truncations_total",
			Help: "Files found shorter than the position read (copytruncate): read again from their start, by include glob."}, []string{"group"})),
		dropped: telemetry.Shared(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_files_dropped_records_total",
			Help: "Lines Kafka or the pipeline refused for good (too large, unknown topic, ...): skipped, by reason."}, []string{"reason"})),
		inflight: telemetry.Shared(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_files_inflight_bytes",
			Help: "Bytes read from files and not yet acknowledged (max_inflight_bytes bounds it)."})),
		checkpoints: telemetry.Shared(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_files_checkpoints_total",
			Help: "Checkpoints written."})),
		rotatedSince: telemetry.Shared(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_files_rotated_since_checkpoint_total",
			Help: "Files rotated since the last checkpoint and unknown to it, found by name and time at a restart and read from their start."})),
		copies: telemetry.Shared(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_files_copytruncate_copies_total",
			Help: "Copies of truncated files (logrotate's copytruncate) found and read from the truncated file's committed offset."})),
		compressedCopies: telemetry.Shared(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_files_compressed_copies_total",
			Help: "Gzip files found to hold the lines of a file already read to its end (logrotate's compress): those lines are not sent again."})),
	}
}
