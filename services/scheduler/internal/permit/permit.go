// Package permit names failback permits so that every scheduler instance
// publishes the same tick under the same id, and JetStream's de-duplication
// (the envelope id is the Nats-Msg-Id) stores it once.
package permit

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// ID derives a UUID v7 from (cluster, group, window, tick start): the
// 48-bit millisecond timestamp is the tick's start, so ids still sort by
// time like every other event id; the version and variant bits are set as
// RFC 9562 requires; the remaining 74 bits come from a SHA-256 of the
// inputs, so two instances agree and two different ticks never collide in
// practice.
func ID(cluster, group, window string, tick time.Time) string {
	ms := tick.UnixMilli()
	h := sha256.Sum256([]byte(cluster + "\x00" + group + "\x00" + window + "\x00" + strconv.FormatInt(ms, 10)))
	var u uuid.UUID
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(ms))
	copy(u[0:6], ts[2:8])
	copy(u[6:16], h[:10])
	u[6] = 0x70 | (u[6] & 0x0f) // version 7
	u[8] = 0x80 | (u[8] & 0x3f) // variant 10
	return u.String()
}
