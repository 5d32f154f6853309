// Package spool owns ferry's disk buffer: an append-only log of records
// between the receivers and Kafka that survives a Kafka outage, an agent
// crash and a torn write, bounded in bytes on disk and in memory.
//
// # Files
//
// The spool is a directory of segment files named by a growing id
// (00000000000000000007.seg) plus a checkpoint and a lock file, all
// readable by the agent's user only. A segment starts with a 32-byte header
// and holds frames:
//
//	header:  "FRYSPL02" | u32 frame limit | u32 flags (1: recycled) |
//	         8-byte secret | u32 0 | u32 CRC32C(the 28 bytes before it)
//	frame:   u32 length | u32 tag | u32 CRC32C(payload, started from the
//	         secret) | payload (one record)
//	payload: i64 timestamp (unix ns, 0 = none) | uvarint len, topic |
//	         uvarint len+1, key (0 = nil key) | uvarint len, value |
//	         uvarint n headers, each uvarint len, key | uvarint len, value
//
// The frame limit is the one in force when the segment was written, so a
// restart with a smaller max_batch_bytes still reads every record it
// acknowledged (the exporter then decides). The secret is random per
// segment and never leaves the directory; the tag is its first four bytes.
// A frame is valid only with the tag and a checksum seeded by the secret,
// so bytes a client put inside a value can never pass for a frame, not even
// when the reader resynchronises after damage. Segments of the first format
// (FRYSPL01: 8-byte magic, frames without tag or secret) are still read;
// since their frames could be forged, damage in one ends that segment.
// The seal is against client bytes only: the secret is in the segment's
// header in clear (a restarted agent must read it), so anyone who can
// write the spool directory can forge or remove frames; the directory's
// permissions are that boundary.
//
// All integers are little-endian. A process appends only to the segment it
// created: Open always starts a new one, so a segment is written by one
// process and then sealed, and recovery never has to reason about a file
// that is still growing.
//
// # Writing and fsync
//
// Consume encodes a batch into one buffer and writes it with one pwrite at
// the end of the active segment (rolling to a new segment past
// segment_bytes). A failed or short write is truncated away, so a frame is
// either whole or absent. The client's batch is completed — its client
// answered "accepted" — according to the fsync policy:
//
//   - always: after an fsync that covers the write. One syncer goroutine
//     runs fsyncs back to back and each one completes every append written
//     before it started (group commit), so many concurrent clients share one
//     fsync instead of paying one each.
//   - interval: at once; a ticker fsyncs every fsync_interval, so a machine
//     crash (not an agent crash: the data is in the page cache) can lose at
//     most that window.
//   - never: at once; the kernel writes back when it likes.
//
// An fsync error is sticky: the spool refuses new data (503) from then on,
// because after a failed fsync Linux may have dropped the dirty pages and
// nothing written before can be trusted to be on disk.
//
// # Reading, acknowledgement and the checkpoint
//
// One reader goroutine reads the log in order, in chunks (1 MiB, more for a
// larger record) into buffers that become the records' memory — nothing is
// copied again before Kafka — and hands each chunk to the exporter as one
// batch. What it holds is reserved from the shared memory budget (capped at
// read_ahead) and given back when Kafka has answered for every record of
// the chunk, so reading is bounded in memory however large the backlog is:
// the spool is streamed, never loaded. While it keeps up with the
// appender it does not read at all: the appender keeps the buffers it just
// wrote, and the reader sends records from them (tail.go); the disk copy is
// for a reader that fell behind and for recovery.
//
// Chunks complete out of order (partitions answer independently). The
// watermark is the position before which every record is acknowledged; it
// advances over completed chunks in read order. It is written to the
// checkpoint (atomically: temp file, fsync, rename) every second and at
// shutdown, and a segment is retired once the watermark has passed its end,
// so a segment goes only when every record in it was acknowledged by Kafka
// (or dead-lettered, below).
//
// # Recycling
//
// A retired segment is kept as a spare (NNN.spare, at most two, and only
// while segments, spares and one more segment fit in max_bytes; fsync
// modes interval and always) and the next segment is written over it in
// place rather than in a new file: writing over blocks and cached pages
// that already exist costs the kernel about 2.5x less CPU per byte than
// filling and later deleting a new file (BenchmarkSegmentWrite), and the
// spool's write was its largest cost. The recycled segment gets a new
// header and secret, fsynced before it takes its name, so its old frames
// never check again; its old bytes past the last frame are cut off when it
// is sealed or closed, and after a crash recovery trims them without
// counting them as damage (the header's recycled flag). recycle.go has the
// details.
//
// # Recovery
//
// Open reads the checkpoint and replays from the watermark: records after
// it that Kafka had acknowledged before a crash are sent again, so a crash
// can duplicate up to one checkpoint interval of records (at-least-once).
// They are counted in ferry_spool_replayed_records_total. Replay is
// streamed like any read and throttled to replay_rate so a large backlog
// does not starve live traffic of disk and CPU.
//
// The newest segment of the previous run is scanned at Open: a torn tail
// (the frame a crash cut short) is truncated and its bytes counted. Any
// frame whose tag or CRC does not match — a flipped byte anywhere — is
// skipped by sliding forward a byte at a time until a frame checks again, so
// intact records after the damage are still delivered. A segment whose
// header is damaged is skipped whole (without the secret nothing in it can
// be told from client bytes). Damage is counted in
// ferry_spool_corrupt_bytes_total and logged.
//
// # What runs where
//
// The Kafka client answers every record on one promise goroutine, shared by
// all partitions and by live traffic in spill mode; anything slow there
// holds up every acknowledgement. So the promise path does only in-memory
// work (recording outcomes, giving a finished chunk's buffer back, moving
// the watermark) and hands the rest to the finisher goroutine through a
// queue that cannot fill (it holds at most a task per record in flight,
// which the read-ahead budget bounds): writing dead letters (a write and
// an fsync, or a produce to the dead-letter topic) and retiring segments
// the watermark has passed. The promise path never takes the appender's
// lock, which appends hold through their writes and a roll through its
// fsync: an exactly-once exporter answers on the goroutine that begins its
// next transaction, and an answer queued behind many clients' appends
// stalled delivery. The finisher drains its queue before Close writes the
// final checkpoint.
//
// # Parts
//
// The Spool's state is split by owner, each part with its lock and file:
//
//	appender (append.go)  the active segment, the segment sizes, the disk
//	                      bound; mu
//	syncer   (sync.go)    group-commit fsync and the appends waiting for it;
//	                      syncMu around an fsync, waitMu for the waiters
//	reader   (reader.go)  the read position and chunks; owned by the reader
//	                      goroutine, no lock
//	ledger   (ledger.go)  chunks in read order, the watermark, the
//	                      checkpoint; ackMu
//	finisher (finish.go)  I/O handed off the promise goroutine; finMu
//
// One lock order: the appender's mu may be held while the syncer's locks
// are taken (an append registers its waiter; a roll fsyncs and closes the
// sealed file), never the other way round. The ledger's and finisher's
// locks are never held with another: a method that needs two parts takes
// one part's lock, copies what it needs and releases it before the next
// (advance: the ledger settles the watermark; when it entered a later
// segment, the finisher has the appender forget the segments before it).
// recover.go rebuilds every part at Open.
//
// # Failures after the spool
//
// A record the exporter fails for a reason retrying cannot fix (too large,
// topic refused, unknown topic) goes to the dead-letter sink with its
// reason and counts as done; a record failed for any other reason is sent
// again with exponential backoff, without limit. Nothing leaves the spool
// otherwise.
//
// # Idempotency keys
//
// A client's retry of a request the spool already accepted (resent after
// a broken connection or a timeout) is recognised by its idempotency key
// and answered with the original result (package idempotency holds the
// index and the protocol; Links.Idem). The spool's part is to keep each
// key durable if and only if its records are, across agent crashes and
// restarts: a key kept without its records would answer "accepted" for
// records that are gone (loss); records kept without their key would let
// the retry append them again (a duplicate).
//
// The keys are in a log of their own in the spool directory
// (dedup-NNN.log, rotated every quarter of the window or of max_bytes;
// sealed files go once all their keys are past the window, or oldest
// first beyond max_bytes):
//
//	file:  "FRYKEY01" | entries
//	entry: u32 n | u32 CRC32C(body) | body (n bytes)
//	body:  u8 1 | i64 time (unix ns) | u64 segment | i64 offset |
//	       u32 length | u32 CRC32C(the append's bytes) | u32 records |
//	       16-byte fingerprint | the scoped key
//
// A keyed append writes its entry, naming the region its records are
// about to take (segment, offset, length and the CRC32C of the bytes),
// then the records, both under the append lock (a batch with several keys
// — the Kafka front's, one per partition's producer sequence, chained by
// Idem.Next — writes one entry per key, all naming the same region, in
// one write, and resolves them together); each fsync round then
// fsyncs the key log before the segment (a roll, which makes its segment
// durable, fsyncs the key log first too), and the client is answered
// only after both. So an agent crash at any point leaves the key with or
// without its records, never the records without the key: both writes
// reach the page cache before anything is answered, and a key written
// without its records is found out at Open. There, every entry is checked
// against the spool: an entry in the newest segment of the previous run
// (the only one a crash can have cut short) is kept only if the bytes at
// its region still have its CRC (a torn append, or one whose write failed
// and was truncated, does not); one in an older segment still on disk
// only if the region is within it; one in a segment already retired (its
// records were all acknowledged by Kafka) is kept; one in a segment
// recovery removed as unreadable is dropped. A damaged or torn key-log
// entry ends its file (what follows is forgotten: those retries are
// accepted again, a duplicate, never a loss).
//
// The limit, and why it was accepted: with fsync always, a power loss
// (not an agent crash) in the instant between an append's write and its
// fsync round may find the segment's pages written back by the kernel on
// its own and the key log's not, so the records survive without their
// key and a retry is accepted again — a duplicate. Closing that needs the
// key durable before the records are written: an fsync under the append
// lock would serialise every append behind it, so the way is an intent
// (key, fingerprint, the CRC32C of the records' payloads) fsynced before
// the append — one more fsync round of latency for keyed requests only —
// and, at Open, a search of the newest segment for the records of any
// intent the log names no place for. Not done yet. The records
// themselves, as in every mode, are never lost to it. With fsync interval
// or never, a power loss can lose either; an agent crash loses neither.
//
// Cost without keys: nothing (Batch.Idem is nil; no key log is opened
// until the first keyed append).
//
// # Reading without the agent
//
// Inspect and Scan (inspect.go) read a spool directory without changing
// it, for ferry spool inspect, verify and dump and ferry validate: the
// same listing, checkpoint, headers, frame scan (walkFrames, shared with
// recovery's tail repair) and decoder, predicting what the next Open and
// its reader would delete, truncate, skip and replay instead of doing it.
// They hold a shared flock on the lock file while they read, so they
// refuse a spool an agent holds (ErrInUse, unless forced) and an agent
// cannot open it under them.
//
// # Bounds
//
// Disk: max_bytes counts every byte of every segment on disk, acknowledged
// or not; an append that would pass it is refused with 429 (503 while Kafka
// is unreachable). Spares are kept only within it (above). Memory: the reader's chunks come out of the shared
// memory budget, and the bytes of batches being appended or waiting for their fsync
// are bounded by write_buffer (refused with 429 beyond it).
package spool
