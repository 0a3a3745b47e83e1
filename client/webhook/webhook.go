// Package webhook signs stockgate's event deliveries and verifies them for
// receivers, by the Standard Webhooks convention (standardwebhooks.com):
// three headers, webhook-id (the event's stable id: de-duplicate by it),
// webhook-timestamp (Unix seconds) and webhook-signature ("v1," and the
// base64 HMAC-SHA256 of "id.timestamp.body" under the secret; several,
// space-separated, while a secret is being rotated).
//
// It is in the client module (standard library only), so a receiver
// depends on nothing of the server's. A receiver in Go:
//
//	v, err := webhook.NewVerifier(secret)
//	...
//	if err := v.Verify(r.Header, body, time.Now()); err != nil { 401 }
package webhook

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stockgate/stockgate/client"
)

// Header names.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// secretPrefix marks a secret's text form: "whsec_" and base64 bytes.
const secretPrefix = "whsec_"

// Tolerance is how far a delivery's timestamp may be from the receiver's
// clock: older deliveries are refused as replays.
const Tolerance = 5 * time.Minute

// Errors a verification returns; match them with errors.Is.
var (
	ErrMissing   = errors.New("webhook: missing id, timestamp or signature header")
	ErrTimestamp = errors.New("webhook: timestamp outside the tolerance")
	ErrSignature = errors.New("webhook: no signature matches")
	ErrSecret    = errors.New("webhook: a secret is whsec_ and base64 of at least 24 bytes")
)

// NewSecret makes a random secret in its text form.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return secretPrefix + base64.StdEncoding.EncodeToString(b)
}

// parseSecret reads a secret's text form.
func parseSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, secretPrefix))
	if err != nil || !strings.HasPrefix(secret, secretPrefix) || len(key) < 24 {
		return nil, ErrSecret
	}
	return key, nil
}

// Signer signs deliveries with one secret.
type Signer struct{ key []byte }

// NewSigner returns a Signer for secret (its text form, see NewSecret).
func NewSigner(secret string) (*Signer, error) {
	key, err := parseSecret(secret)
	if err != nil {
		return nil, err
	}
	return &Signer{key: key}, nil
}

// Sign sets the three headers of a delivery of body as event id at t.
func (s *Signer) Sign(h http.Header, id string, body []byte, t time.Time) {
	ts := strconv.FormatInt(t.Unix(), 10)
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, "v1,"+sign(s.key, id, ts, body))
}

func sign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Verifier checks deliveries against one or more secrets (more than one
// while a secret is rotated).
type Verifier struct{ keys [][]byte }

// NewVerifier returns a Verifier accepting a signature by any of secrets.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, ErrSecret
	}
	v := &Verifier{}
	for _, s := range secrets {
		key, err := parseSecret(s)
		if err != nil {
			return nil, err
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// Verify checks a delivery's headers and body at now: its timestamp is
// within Tolerance and one of its v1 signatures is by one of the secrets.
// Compare in constant time; an error says which check failed.
func (v *Verifier) Verify(h http.Header, body []byte, now time.Time) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return ErrMissing
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q", ErrTimestamp, ts)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: %v off", ErrTimestamp, d.Round(time.Second))
	}
	for _, key := range v.keys {
		want := []byte(sign(key, id, ts, body))
		for _, sig := range strings.Fields(sigs) {
			version, got, ok := strings.Cut(sig, ",")
			if ok && version == "v1" && hmac.Equal([]byte(got), want) {
				return nil
			}
		}
	}
	return ErrSignature
}

// Event is an event as a delivery's body carries it: the client's type,
// the one wire shape of an event (relay streams and GET /v1/admin/events
// carry it too). A receiver decodes the body into it after Verify.
type Event = client.Event
