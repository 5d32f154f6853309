package spool

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	appendedRecords prometheus.Counter
	appendedBytes   prometheus.Counter
	delivered       prometheus.Counter
	retried         prometheus.Counter
	deadLettered    prometheus.Counter
	replayed        prometheus.Counter
	refused         *prometheus.CounterVec
	corruptBytes    *prometheus.CounterVec
	corruptRegions  prometheus.Counter
	writeErrors     prometheus.Counter
	recycled        prometheus.Counter
	readBytes       *prometheus.CounterVec
	fsyncs          prometheus.Counter
	fsyncSeconds    prometheus.Histogram
	backlogAtOpen   prometheus.Gauge
	replaySeconds   prometheus.Gauge
	resumeSkipped   prometheus.Counter
	resumeMismatch  prometheus.Counter

	backlogAtOpenValue int64
}

func newMetrics(reg prometheus.Registerer, s *Spool) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		appendedRecords: c("ferry_spool_appended_records_total", "Records written to the spool."),
		appendedBytes:   c("ferry_spool_appended_bytes_total", "Bytes written to the spool, framing included."),
		delivered:       c("ferry_spool_delivered_records_total", "Records read from the spool and acknowledged by Kafka."),
		retried:         c("ferry_spool_retried_records_total", "Records from the spool that failed and were sent again."),
		deadLettered:    c("ferry_spool_dead_lettered_records_total", "Records Kafka refused for good, moved to the dead-letter sink."),
		replayed: c("ferry_spool_replayed_records_total",
			"Records read that were on disk when ferry started (or were spilled): after a crash, those Kafka had already acknowledged are duplicates."),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_spool_refused_records_total",
			Help: "Records the spool refused to store, by reason."}, []string{"reason"}),
		corruptBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_spool_corrupt_bytes_total",
			Help: "Damaged spool bytes: truncated (a torn tail cut at start) or skipped (failed checksum while reading)."}, []string{"kind"}),
		readBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ferry_spool_read_bytes_total",
			Help: "Bytes the reader sent on, by where it took them: memory (appends it had kept up with) or disk."}, []string{"from"}),
		corruptRegions: c("ferry_spool_corrupt_regions_total", "Damaged stretches found in the spool (and unreadable checkpoints)."),
		writeErrors:    c("ferry_spool_write_errors_total", "Failed writes to the spool (the request was refused)."),
		recycled:       c("ferry_spool_segments_recycled_total", "Segments written over a spare (an emptied segment file) instead of a new file."),
		fsyncs:         c("ferry_spool_fsyncs_total", "fsync calls on spool segments."),
		fsyncSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ferry_spool_fsync_duration_seconds",
			Help: "Time per spool fsync.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}),
		backlogAtOpen: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_spool_backlog_at_start_bytes",
			Help: "Unacknowledged bytes found on disk when ferry started."}),
		replaySeconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_spool_replay_seconds",
			Help: "Time from start until Kafka acknowledged the whole backlog found at start (0 until then)."}),
		resumeSkipped: c("ferry_spool_resume_skipped_bytes_total",
			"Exactly once: spool bytes after the checkpoint that Kafka had committed before a restart, not sent again."),
		resumeMismatch: c("ferry_spool_resume_mismatch_total",
			"Exactly once: starts where the position Kafka committed was not in this spool (started from the checkpoint)."),
	}
	for _, kind := range []string{"truncated", "skipped"} {
		m.corruptBytes.WithLabelValues(kind)
	}
	for _, from := range []string{"memory", "disk"} {
		m.readBytes.WithLabelValues(from)
	}
	disk := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_spool_bytes", Help: "Bytes of every spool segment on disk."},
		func() float64 { return float64(s.DiskBytes()) })
	backlog := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_spool_backlog_bytes",
		Help: "Spool bytes not yet acknowledged by Kafka."}, func() float64 { return float64(s.Backlog()) })
	spares := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ferry_spool_spare_bytes",
		Help: "Bytes of the emptied segment files kept to be overwritten by the next segments (within max_bytes)."},
		func() float64 { return float64(s.spareBytes()) })
	limit := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ferry_spool_limit_bytes", Help: "The configured max_bytes."})
	limit.Set(float64(s.cfg.MaxBytes))
	reg.MustRegister(m.appendedRecords, m.appendedBytes, m.delivered, m.retried, m.deadLettered, m.replayed, m.refused,
		m.corruptBytes, m.corruptRegions, m.writeErrors, m.fsyncs, m.fsyncSeconds, m.backlogAtOpen, m.replaySeconds, disk, spares, backlog, limit, m.recycled, m.readBytes, m.resumeSkipped, m.resumeMismatch)
	return m
}
