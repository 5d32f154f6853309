package wire

import (
	"google.golang.org/protobuf/encoding/protowire"
)

// LogRecord is a view of one OTLP log record.
type LogRecord struct {
	Raw            []byte
	Time           uint64
	ObservedTime   uint64
	SeverityNumber int32
	SeverityText   []byte
	Body           Value
	HasBody        bool
	Flags          uint32
	TraceID        []byte
	SpanID         []byte
	EventName      []byte
	DroppedAttrs   uint32
}

// Attributes iterates the record's attributes.
func (l *LogRecord) Attributes() Attrs { return Attrs{Repeated{msg: l.Raw, num: 6}} }

// Logs iterates the log records of a LogsData / ExportLogsServiceRequest.
// Use it as Traces.
type Logs struct {
	w  walker
	lr LogRecord
}

// NewLogs starts iterating data.
func NewLogs(data []byte) Logs { return Logs{w: newWalker(data, &logsPaths)} }

// Next decodes the next record; false at the end or on error (see Err).
func (l *Logs) Next() bool {
	item, ok := l.w.nextItem()
	if !ok {
		return false
	}
	if err := decodeLogRecord(item, &l.lr); err != nil {
		l.w.err = err
		return false
	}
	return true
}

// Record is the current log record.
func (l *Logs) Record() *LogRecord { return &l.lr }

// Resource is the current record's resource.
func (l *Logs) Resource() *Resource { return &l.w.res }

// Scope is the current record's scope.
func (l *Logs) Scope() *Scope { return &l.w.sc }

// Err is the decode error that ended the iteration, if any.
func (l *Logs) Err() error { return l.w.err }

func decodeLogRecord(b []byte, l *LogRecord) error {
	*l = LogRecord{Raw: b}
	c := cursor{rest: b}
	for len(c.rest) > 0 {
		if !c.next() {
			return errAt("log_record", errTruncated.Error())
		}
		f := &c
		switch f.num {
		case 1, 11:
			if err := wantType("log_record.time", f, protowire.Fixed64Type); err != nil {
				return err
			}
			if f.num == 1 {
				l.Time = f.u
			} else {
				l.ObservedTime = f.u
			}
		case 2:
			if err := wantType("log_record.severity_number", f, protowire.VarintType); err != nil {
				return err
			}
			l.SeverityNumber = int32(f.u)
		case 3, 9, 10, 12:
			if err := wantType("log_record", f, protowire.BytesType); err != nil {
				return err
			}
			switch f.num {
			case 3:
				l.SeverityText = f.b
			case 9:
				l.TraceID = f.b
			case 10:
				l.SpanID = f.b
			case 12:
				l.EventName = f.b
			}
		case 5:
			if err := wantType("log_record.body", f, protowire.BytesType); err != nil {
				return err
			}
			v, err := decodeValue(f.b, 0)
			if err != nil {
				return errAt("log_record.body", err.Error())
			}
			l.Body, l.HasBody = v, true
		case 6:
			if err := wantType("log_record.attributes", f, protowire.BytesType); err != nil {
				return err
			}
			if err := validKV(f.b); err != nil {
				return errAt("log_record.attributes", err.Error())
			}
		case 7:
			if err := wantType("log_record.dropped_attributes_count", f, protowire.VarintType); err != nil {
				return err
			}
			l.DroppedAttrs = uint32(f.u)
		case 8:
			if err := wantType("log_record.flags", f, protowire.Fixed32Type); err != nil {
				return err
			}
			l.Flags = uint32(f.u)
		}
	}
	if err := checkID("log_record.trace_id", l.TraceID, 16); err != nil {
		return err
	}
	return checkID("log_record.span_id", l.SpanID, 8)
}
