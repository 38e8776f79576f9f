package events

import (
	"encoding/json"
	"fmt"
	"time"
)

// ArbiterLease is the name of the arbiter's lease (LeaseSubject(cluster,
// ArbiterLease)); its terms are the epochs of every command.
const ArbiterLease = "arbiter"

// LeaseRecord is one message on a lease subject. It is not an envelope event:
// the lease lives in the command stream, where its stream sequence, not a
// field, is what fences. A term starts with a record whose Epoch is 0 (the
// record's own sequence is the term); every renewal in the term carries the
// term in Epoch. Executors read these records to check that a command's
// epoch is a term that exists.
type LeaseRecord struct {
	Holder string    `json:"holder"`
	Epoch  uint64    `json:"epoch,omitempty"`
	At     time.Time `json:"at"`
}

// Term is the term a record stored at seq belongs to.
func (r LeaseRecord) Term(seq uint64) uint64 {
	if r.Epoch == 0 {
		return seq
	}
	return r.Epoch
}

// DecodeLeaseRecord reads a lease record and checks that it can belong to
// the sequence it is stored at: a renewal names a term that started before
// it (a record naming its own or a later sequence is forged).
func DecodeLeaseRecord(data []byte, seq uint64) (LeaseRecord, error) {
	var r LeaseRecord
	if err := json.Unmarshal(data, &r); err != nil {
		return LeaseRecord{}, fmt.Errorf("%w: lease record: %v", ErrInvalidField, err)
	}
	if r.Epoch >= seq && seq > 0 {
		return LeaseRecord{}, fmt.Errorf("%w: lease record at sequence %d names term %d, which cannot have started yet", ErrInvalidField, seq, r.Epoch)
	}
	return r, nil
}
