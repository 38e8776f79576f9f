package ami

import (
	"strings"

	"github.com/staskobzar/goami2"
)

// Field is one header of an action or a message.
type Field struct {
	Name  string
	Value string
}

// F is shorthand for Field{name, value}.
func F(name, value string) Field { return Field{Name: name, Value: value} }

func fieldsOf(m *goami2.Message) []Field {
	if m == nil {
		return nil
	}
	hs := m.Headers()
	out := make([]Field, len(hs))
	for i, h := range hs {
		out[i] = Field{Name: h.Name, Value: h.Value}
	}
	return out
}

// Response is the answer to one action. For a list action (DBGetTree,
// DBGet, …, answered with "EventList: start") it also holds the list's
// events, collected up to the Complete event.
type Response struct {
	msg      *goami2.Message
	events   []Event
	complete *goami2.Message
}

// Success reports "Response: Success". Note that a Command answered with
// Error still says "Message: Command output follows".
func (r Response) Success() bool { return r.msg != nil && r.msg.IsSuccess() }

// Field returns the first value of a header (case-insensitive), or "".
func (r Response) Field(name string) string {
	if r.msg == nil {
		return ""
	}
	return r.msg.Field(name)
}

// Fields returns every header in order.
func (r Response) Fields() []Field { return fieldsOf(r.msg) }

// Message is the Message header.
func (r Response) Message() string { return r.Field("Message") }

// Outputs are the Output lines of a Command response, in order.
func (r Response) Outputs() []string {
	if r.msg == nil {
		return nil
	}
	return r.msg.FieldValues("Output")
}

// Events are the items of a list response, without its Complete event.
func (r Response) Events() []Event { return r.events }

// Complete is the event that ended a list response (its ListItems field
// says how many items Asterisk sent); false for other responses.
func (r Response) Complete() (Event, bool) {
	if r.complete == nil {
		return Event{}, false
	}
	return Event{msg: r.complete}, true
}

// String is the response as it came on the wire (headers only).
func (r Response) String() string {
	if r.msg == nil {
		return ""
	}
	return r.msg.String()
}

// Event is an AMI event: an unsolicited one from Client.Events, or an item
// of a list response.
type Event struct{ msg *goami2.Message }

// Name is the Event header.
func (e Event) Name() string { return e.Field("Event") }

// Field returns the first value of a header (case-insensitive), or "".
func (e Event) Field(name string) string {
	if e.msg == nil {
		return ""
	}
	return e.msg.Field(name)
}

// Fields returns every header in order.
func (e Event) Fields() []Field { return fieldsOf(e.msg) }

// String is the event as it came on the wire.
func (e Event) String() string {
	if e.msg == nil {
		return ""
	}
	return e.msg.String()
}

func isListStart(m *goami2.Message) bool {
	return m.IsSuccess() && strings.EqualFold(m.Field("EventList"), "start")
}

func isListComplete(m *goami2.Message) bool {
	return strings.EqualFold(m.Field("EventList"), "Complete")
}
