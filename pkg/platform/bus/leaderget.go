package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/nats-io/nats.go"
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
	req, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{events.KVSubject(bucket, key)})
	if err != nil {
		return nil, err
	}
	m, err := b.NC.RequestWithContext(ctx, events.JSStreamMsgGetSubject(events.KVStreamName(bucket)), req)
	if err != nil {
		return nil, fmt.Errorf("leader read of %s: %w", key, err)
	}
	var resp struct {
		Message *struct {
			Header []byte `json:"hdrs"`
			Data   []byte `json:"data"`
		} `json:"message"`
		Error *struct {
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("leader read of %s: %w", key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == errNoMessage:
		return nil, nil
	case resp.Error != nil:
		return nil, fmt.Errorf("leader read of %s: %s (%d)", key, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, fmt.Errorf("leader read of %s: %w", key, errors.New("empty answer"))
	}
	if len(resp.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("leader read of %s: %w", key, err)
		}
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, nil
		}
	}
	return resp.Message.Data, nil
}
