package dispatcher

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
)

// RPCError is a JSON-RPC error object returned by Kamailio.
type RPCError struct {
	Method  string
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *RPCError) Error() string {
	return fmt.Sprintf("kamailio rpc %s: %d %s", e.Method, e.Code, e.Message)
}

// Unwrap maps the messages callers act on to sentinels.
func (e *RPCError) Unwrap() error {
	switch {
	case strings.Contains(e.Message, "Ongoing reload"):
		// dispatcher's reload_delta (default 5 s) rate-limits reload, add and
		// remove; the same call succeeds later.
		return ErrReloadBusy
	case e.Message == "Method Not Found":
		return ErrNoMethod
	}
	return nil
}

// rpc is a minimal JSON-RPC 2.0 client for Kamailio's jsonrpcs module served
// over xhttp (POST /RPC).
type rpc struct {
	url  string
	http *http.Client
	id   atomic.Int64
}

func (c *rpc) call(ctx context.Context, method string, result any, params ...any) error {
	if params == nil {
		params = []any{}
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": c.id.Add(1)})
	if err != nil {
		return fmt.Errorf("kamailio rpc %s: encoding: %w", method, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("kamailio rpc %s: %w", method, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("kamailio rpc %s: %w", method, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("kamailio rpc %s: reading reply: %w", method, err)
	}
	var reply struct {
		Result json.RawMessage `json:"result"`
		Error  *RPCError       `json:"error"`
	}
	if err := json.Unmarshal(raw, &reply); err != nil {
		return fmt.Errorf("kamailio rpc %s: HTTP %s, undecodable reply %.200q: %w", method, resp.Status, raw, err)
	}
	if reply.Error != nil {
		reply.Error.Method = method
		return reply.Error
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kamailio rpc %s: HTTP %s", method, resp.Status)
	}
	if result == nil {
		return nil
	}
	if len(reply.Result) == 0 {
		return fmt.Errorf("kamailio rpc %s: %w", method, errors.New("reply has no result"))
	}
	if err := json.Unmarshal(reply.Result, result); err != nil {
		return fmt.Errorf("kamailio rpc %s: decoding result: %w", method, err)
	}
	return nil
}
