package kafkafront

import (
	"reflect"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestTopLevelErrorFieldsExist: every API answered UNSUPPORTED_VERSION by
// setting a top-level ErrorCode has that field in kmsg's response (a
// kmsg upgrade that renamed it would otherwise panic at run time).
func TestTopLevelErrorFieldsExist(t *testing.T) {
	for key := range topLevelError {
		req := kmsg.RequestForKey(key)
		if req == nil {
			t.Fatalf("API key %d unknown to kmsg", key)
		}
		f := reflect.ValueOf(req.ResponseKind()).Elem().FieldByName("ErrorCode")
		if !f.IsValid() || f.Kind() != reflect.Int16 {
			t.Fatalf("%s response has no int16 ErrorCode", kmsg.NameForKey(key))
		}
	}
}
