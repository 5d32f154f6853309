package record

import (
	"reflect"
	"testing"
)

func TestReceiptRangesMergeConsecutiveOffsets(t *testing.T) {
	rc := NewReceipt(7)
	rc.Acked(0, "a", 0, 10)
	rc.Acked(1, "a", 0, 11)
	rc.Acked(2, "a", 1, 5)  // another partition: a new range
	rc.Acked(3, "a", 0, 12) // back to partition 0: a new range (record order is kept)
	// 4 failed: the range before it closes
	rc.Acked(5, "a", 0, 13)
	rc.Acked(6, "b", 0, 14) // another topic
	got := rc.Ranges(nil)
	want := []Range{{"a", 0, 10, 2}, {"a", 1, 5, 1}, {"a", 0, 12, 1}, {"a", 0, 13, 1}, {"b", 0, 14, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ranges\n got %+v\nwant %+v", got, want)
	}
	rc.Acked(99, "x", 0, 0) // out of range: ignored, no panic
	rc.Acked(-1, "x", 0, 0)
}

func TestReceiptNoneAcked(t *testing.T) {
	if got := NewReceipt(3).Ranges(nil); len(got) != 0 {
		t.Fatalf("%+v", got)
	}
}
