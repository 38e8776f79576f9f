package events

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Direct content transfer: a holder's replicator serves the contents of its
// trees to its peers by request over the bus, so that a large pass (a first
// sync, a restored spool) does not have to be written into the object store
// and read back out of it. Requests go to the holder's own subject; the
// answer is one message to the requester's inbox (a service may answer
// exactly one message per request), so a target pipelines several requests.
// Everything is checked by its SHA-256 on the target, so the answering node
// is trusted with nothing but availability.

// ContentRoot is the root of the content-request subjects.
const ContentRoot = "fan.content"

// ContentSubject is where node's replicator answers content requests.
func ContentSubject(cluster, node string) string {
	return ContentRoot + "." + cluster + "." + node
}

// ContentLengthsHeader lists, in the order requested, how many bytes of each
// requested range the answer's body holds ("-" for a content the node does
// not hold). The list may stop before the last range: the answer's size is
// bounded, and the requester asks again for what is left.
const ContentLengthsHeader = "Fan-Content-Lengths"

// Bounds of one content request.
const (
	// MaxContentRanges bounds the ranges of one request.
	MaxContentRanges = 1024
	// MaxContentRequest bounds a request's encoded size (a thousand ranges
	// fit several times over).
	MaxContentRequest = 256 << 10
)

// ContentRange is part of one content: Length bytes from Offset.
type ContentRange struct {
	Hash   string `json:"hash"`
	Offset int64  `json:"offset,omitempty"`
	Length int64  `json:"length"`
}

// ContentRequest asks a node for ranges of contents of one of its trees.
type ContentRequest struct {
	Group  string         `json:"group"`
	Tree   string         `json:"tree"`
	Ranges []ContentRange `json:"ranges"`
}

// Validate bounds a request before anything is read for it.
func (r ContentRequest) Validate() error {
	if err := ValidToken("group", r.Group); err != nil {
		return err
	}
	if err := ValidToken("tree", r.Tree); err != nil {
		return err
	}
	if len(r.Ranges) == 0 || len(r.Ranges) > MaxContentRanges {
		return fmt.Errorf("%w: %d ranges (1..%d)", ErrInvalidField, len(r.Ranges), MaxContentRanges)
	}
	for _, rg := range r.Ranges {
		if !ValidContentHash(rg.Hash) {
			return fmt.Errorf("%w: hash %.80q", ErrInvalidField, rg.Hash)
		}
		if rg.Offset < 0 || rg.Length <= 0 {
			return fmt.Errorf("%w: range %d+%d of %s", ErrInvalidField, rg.Offset, rg.Length, rg.Hash)
		}
	}
	return nil
}

// DecodeContentRequest decodes and validates a request.
func DecodeContentRequest(data []byte) (ContentRequest, error) {
	var r ContentRequest
	if len(data) > MaxContentRequest {
		return r, fmt.Errorf("%w: request of %d bytes (at most %d)", ErrInvalidField, len(data), MaxContentRequest)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%w: %v", ErrInvalidField, err)
	}
	return r, r.Validate()
}

// ValidContentHash says whether h names a content: a SHA-256 as the
// replicator writes it (64 lower-case hex digits), in manifests and in
// content requests alike.
func ValidContentHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for i := range len(h) {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// FormatContentLengths writes the lengths header; a negative length is a
// content not held.
func FormatContentLengths(lengths []int64) string {
	var b strings.Builder
	for i, n := range lengths {
		if i > 0 {
			b.WriteByte(',')
		}
		if n < 0 {
			b.WriteByte('-')
			continue
		}
		b.WriteString(strconv.FormatInt(n, 10))
	}
	return b.String()
}

// ParseContentLengths reads the lengths header of an answer to req whose
// body has size bytes: a length of -1 is a content not held. It refuses a
// list longer than the request, a length over its range's and lengths that
// do not add up to the body.
func ParseContentLengths(v string, req ContentRequest, size int) ([]int64, error) {
	if v == "" {
		return nil, fmt.Errorf("%w: answer without %s", ErrInvalidField, ContentLengthsHeader)
	}
	parts := strings.Split(v, ",")
	if len(parts) > len(req.Ranges) {
		return nil, fmt.Errorf("%w: %d lengths for %d ranges", ErrInvalidField, len(parts), len(req.Ranges))
	}
	out := make([]int64, len(parts))
	var sum int64
	for i, p := range parts {
		if p == "-" {
			out[i] = -1
			continue
		}
		n, err := strconv.ParseInt(p, 10, 64)
		if err != nil || n < 0 || n > req.Ranges[i].Length {
			return nil, fmt.Errorf("%w: length %.20q for a range of %d", ErrInvalidField, p, req.Ranges[i].Length)
		}
		out[i] = n
		sum += n
	}
	if sum != int64(size) {
		return nil, fmt.Errorf("%w: lengths add up to %d, body has %d", ErrInvalidField, sum, size)
	}
	return out, nil
}
