package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fanpbx/fan/pkg/events"
)

// errNoMessage is nats-server's error code for "no message found".
const errNoMessage = 10037

// LeaderGetKV reads key of bucket through the bucket stream's raft leader;
// a missing, deleted or purged key is (nil, nil). jetstream's KV Get is a
// direct get, which any replica may answer, one back from a partition with
// what it had before it: an executor deciding whether it still holds an
// address must not believe that. While the stream has no leader the read
// fails (ctx's deadline) instead.
func (b *Bus) LeaderGetKV(ctx context.Context, bucket, key string) ([]byte, error) {
	m, err := leaderGet(ctx, b.NC, events.KVStreamName(bucket), leaderGetRequest{LastBySubject: events.KVSubject(bucket, key)})
	if err != nil {
		return nil, fmt.Errorf("leader read of %s: %w", key, err)
	}
	if m == nil {
		return nil, nil
	}
	if len(m.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Header)
		if err != nil {
			return nil, fmt.Errorf("leader read of %s: %w", key, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, nil
		}
	}
	return m.Data, nil
}

// leaderGetRequest is the stream API's message get: one of the two.
type leaderGetRequest struct {
	Seq           uint64 `json:"seq,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
}

// storedMsg is a message as the stream API's message get returns it.
type storedMsg struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"seq"`
	Header   []byte    `json:"hdrs"`
	Data     []byte    `json:"data"`
	Time     time.Time `json:"time"`
}

// leaderGet asks stream's raft leader for one message; (nil, nil) when
// there is none.
func leaderGet(ctx context.Context, nc *nats.Conn, stream string, req leaderGetRequest) (*storedMsg, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	m, err := nc.RequestWithContext(ctx, events.JSStreamMsgGetSubject(stream), data)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *storedMsg `json:"message"`
		Error   *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == errNoMessage:
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("%s (%d)", resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, errors.New("empty answer")
	}
	return resp.Message, nil
}
