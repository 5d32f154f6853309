// Package token owns ferry's application tokens: their format, issuing, and
// verification with a set of keys that allows rotation.
//
// A token is base64url (no padding) of
//
//	version (1 byte) ‖ key id (2 bytes, big-endian) ‖ nonce (12 bytes) ‖ AES-256-GCM(payload) with its 16-byte tag
//
// The version and key id are authenticated as additional data, so no byte of
// a token can be changed without the tag failing (an AES-CBC token, with no
// integrity check, could be altered undetected). Every configured key
// verifies; one is marked for issuing. Keys are 32 bytes, configured by id.
//
// The payload is a compact list of fields, each tag (1 byte) ‖ uvarint
// length ‖ value, so new fields can be added without a new version; unknown
// tags are skipped. See docs/tokens.md.
package token

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ferryhq/ferry/signal"
)

// Version is the token format version this package writes.
const Version = 1

const (
	headerLen = 1 + 2
	nonceLen  = 12
	tagLen    = 16
	minLen    = headerLen + nonceLen + tagLen
	// MaxLen bounds a token's text so a hostile header cannot cost more.
	MaxLen = 4096
)

// Signals a token can route, indexing Claims.Topics and Claims.DataIDs:
// the one signal type's values (package signal), as indexes.
const (
	Traces     = int(signal.Traces)
	Metrics    = int(signal.Metrics)
	Logs       = int(signal.Logs)
	Messages   = int(signal.Messages)
	numSignals = int(signal.Count)
)

// SignalNames name the signals as the CLI and docs write them.
var SignalNames = [numSignals]string{signal.Traces.String(), signal.Metrics.String(), signal.Logs.String(), signal.Messages.String()}

// SignalIndex returns the index of a signal name, or -1.
func SignalIndex(name string) int {
	if s, ok := signal.Parse(name); ok {
		return int(s)
	}
	return -1
}

// Claims is what a token says about its holder. Arrays rather than maps keep
// verification to a single allocation.
type Claims struct {
	App        string             // tenant / application name
	BusinessID uint64             // optional business id
	Topics     [numSignals]string // per signal → topic ("" = none)
	DataIDs    [numSignals]uint64 // per signal → data id (routing by data id; 0 = none)
	Expires    time.Time          // zero: never
	RateClass  string             // optional rate-limit class
	// TopicPattern, when set, is a glob (path.Match: *, ?, [...]) every
	// topic the holder writes to must match, on every receiver: it scopes
	// a tenant to its own topics whatever the routing.
	TopicPattern string
}

// Payload field tags.
const (
	fApp       = 1
	fBusiness  = 2
	fTopic     = 3 // value: signal ‖ 0 ‖ topic
	fDataID    = 4 // value: signal ‖ 0 ‖ uvarint
	fExpires   = 5 // uvarint unix seconds
	fRateClass = 6
	fTopicPat  = 7
)

// Failure reasons, the counter labels of refused tokens. A reason never
// includes any part of the token or a key.
const (
	ReasonMissing   = "missing"
	ReasonMalformed = "malformed"   // not base64url, too short or too long
	ReasonVersion   = "bad_version" // unknown format version
	ReasonKey       = "unknown_key" // key id not configured
	ReasonForged    = "forged"      // authentication failed: tampered, truncated or wrong key
	ReasonExpired   = "expired"
	ReasonPayload   = "bad_payload" // decrypted but not a valid payload
)

// Error is a refused token.
type Error struct{ Reason string }

func (e *Error) Error() string { return "invalid token: " + e.Reason }

// Keyring holds the keys that verify and the one that issues.
type Keyring struct {
	aeads    map[uint16]cipher.AEAD
	issuer   uint16
	canIssue bool
}

// NewKeyring builds a keyring from 32-byte keys by id; issuer names the key
// used by Issue (ignored if absent).
func NewKeyring(keys map[uint16][]byte, issuer uint16) (*Keyring, error) {
	k := &Keyring{aeads: map[uint16]cipher.AEAD{}, issuer: issuer}
	for id, key := range keys {
		if len(key) != 32 {
			return nil, fmt.Errorf("key %d: %d bytes, want 32 (AES-256)", id, len(key))
		}
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, err
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, err
		}
		k.aeads[id] = aead
		if id == issuer {
			k.canIssue = true
		}
	}
	return k, nil
}

// Issue encrypts c into a token with the issuing key.
func (k *Keyring) Issue(c Claims) (string, error) {
	if !k.canIssue {
		return "", errors.New("no key is marked for issuing")
	}
	if c.App == "" {
		return "", errors.New("a token needs an app")
	}
	aead := k.aeads[k.issuer]
	buf := make([]byte, headerLen+nonceLen, minLen+len(c.App)+64)
	buf[0] = Version
	binary.BigEndian.PutUint16(buf[1:3], k.issuer)
	if _, err := rand.Read(buf[headerLen:]); err != nil {
		return "", err
	}
	sealed := aead.Seal(buf, buf[headerLen:], encodeClaims(c), buf[:headerLen])
	return base64.RawURLEncoding.EncodeToString(sealed), nil
}

// canonicalTail reports whether the unused low bits of a last partial
// base64 group are zero, so a token has one spelling (a lenient decode let a
// rewritten tail verify as the token it came from). base64's Strict mode
// checks the same at ~50 ns a token; this is one lookup.
func canonicalTail(tok string) bool {
	var unused byte
	switch len(tok) % 4 {
	case 2:
		unused = 0x0f // 12 bits carry 8
	case 3:
		unused = 0x03 // 18 bits carry 16
	default:
		return true
	}
	c := tok[len(tok)-1]
	var v byte
	switch {
	case c >= 'A' && c <= 'Z':
		v = c - 'A'
	case c >= 'a' && c <= 'z':
		v = c - 'a' + 26
	case c >= '0' && c <= '9':
		v = c - '0' + 52
	case c == '-':
		v = 62
	default: // '_'; anything else failed the decode
		v = 63
	}
	return v&unused == 0
}

// Verify decrypts and checks a token. now is used for expiry.
func (k *Keyring) Verify(tok string, now time.Time) (Claims, error) {
	if len(tok) == 0 {
		return Claims{}, &Error{ReasonMissing}
	}
	// Go's base64 skips \r and \n even in strict mode: one spelling.
	if len(tok) > MaxLen || strings.IndexByte(tok, '\n') >= 0 || strings.IndexByte(tok, '\r') >= 0 {
		return Claims{}, &Error{ReasonMalformed}
	}
	var stack [512]byte // most tokens decode without a heap allocation
	var raw []byte
	if n := base64.RawURLEncoding.DecodedLen(len(tok)); n <= len(stack) {
		raw = stack[:n]
	} else {
		raw = make([]byte, n)
	}
	n, err := base64.RawURLEncoding.Decode(raw, []byte(tok))
	if err != nil || n < minLen || !canonicalTail(tok) {
		return Claims{}, &Error{ReasonMalformed}
	}
	raw = raw[:n]
	if raw[0] != Version {
		return Claims{}, &Error{ReasonVersion}
	}
	aead, ok := k.aeads[binary.BigEndian.Uint16(raw[1:3])]
	if !ok {
		return Claims{}, &Error{ReasonKey}
	}
	nonce := raw[headerLen : headerLen+nonceLen]
	plain, err := aead.Open(raw[headerLen+nonceLen:headerLen+nonceLen], nonce, raw[headerLen+nonceLen:], raw[:headerLen])
	if err != nil {
		return Claims{}, &Error{ReasonForged}
	}
	c, err := decodeClaims(plain)
	if err != nil {
		return Claims{}, &Error{ReasonPayload}
	}
	if !c.Expires.IsZero() && !now.Before(c.Expires) {
		return c, &Error{ReasonExpired}
	}
	return c, nil
}

func appendField(b []byte, tag byte, v []byte) []byte {
	b = append(b, tag)
	b = protowire.AppendVarint(b, uint64(len(v)))
	return append(b, v...)
}

func encodeClaims(c Claims) []byte {
	var b []byte
	b = appendField(b, fApp, []byte(c.App))
	if c.BusinessID != 0 {
		b = appendField(b, fBusiness, protowire.AppendVarint(nil, c.BusinessID))
	}
	for i, t := range c.Topics {
		if t != "" {
			b = appendField(b, fTopic, append(append([]byte(SignalNames[i]), 0), t...))
		}
	}
	for i, id := range c.DataIDs {
		if id != 0 {
			b = appendField(b, fDataID, protowire.AppendVarint(append([]byte(SignalNames[i]), 0), id))
		}
	}
	if !c.Expires.IsZero() {
		b = appendField(b, fExpires, protowire.AppendVarint(nil, uint64(c.Expires.Unix())))
	}
	if c.TopicPattern != "" {
		b = appendField(b, fTopicPat, []byte(c.TopicPattern))
	}
	if c.RateClass != "" {
		b = appendField(b, fRateClass, []byte(c.RateClass))
	}
	return b
}

func decodeClaims(plain []byte) (Claims, error) {
	var c Claims
	bad := errors.New("bad payload")
	// One allocation: every string field is a substring of this copy.
	str := string(plain)
	for off := 0; off < len(str); {
		tag := str[off]
		l, n := protowire.ConsumeVarint(plain[off+1:])
		if n < 0 || l > uint64(len(str)-off-1-n) {
			return c, bad
		}
		vs, ve := off+1+n, off+1+n+int(l)
		v, vstr := plain[vs:ve], str[vs:ve]
		off = ve
		switch tag {
		case fApp:
			c.App = vstr
		case fBusiness:
			x, m := protowire.ConsumeVarint(v)
			if m != len(v) {
				return c, bad
			}
			c.BusinessID = x
		case fTopic, fDataID:
			i := indexByte(v, 0)
			if i <= 0 {
				return c, bad
			}
			sig := SignalIndex(vstr[:i])
			if sig < 0 {
				continue // a signal this version does not know
			}
			if tag == fTopic {
				c.Topics[sig] = vstr[i+1:]
			} else {
				x, m := protowire.ConsumeVarint(v[i+1:])
				if m != len(v)-i-1 {
					return c, bad
				}
				c.DataIDs[sig] = x
			}
		case fExpires:
			x, m := protowire.ConsumeVarint(v)
			if m != len(v) {
				return c, bad
			}
			c.Expires = time.Unix(int64(x), 0)
		case fRateClass:
			c.RateClass = vstr
		case fTopicPat:
			c.TopicPattern = vstr
		}
	}
	if c.App == "" {
		return c, bad
	}
	return c, nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// String renders claims for `ferry token inspect`, never including keys.
func (c Claims) String() string {
	s := "app: " + c.App + "\n"
	if c.BusinessID != 0 {
		s += "business_id: " + strconv.FormatUint(c.BusinessID, 10) + "\n"
	}
	for i, t := range c.Topics {
		if t != "" {
			s += "topic." + SignalNames[i] + ": " + t + "\n"
		}
	}
	for i, id := range c.DataIDs {
		if id != 0 {
			s += "data_id." + SignalNames[i] + ": " + strconv.FormatUint(id, 10) + "\n"
		}
	}
	if !c.Expires.IsZero() {
		s += "expires: " + c.Expires.UTC().Format(time.RFC3339) + "\n"
	} else {
		s += "expires: never\n"
	}
	if c.TopicPattern != "" {
		s += "topic_pattern: " + c.TopicPattern + "\n"
	}
	if c.RateClass != "" {
		s += "rate_class: " + c.RateClass + "\n"
	}
	return s
}
