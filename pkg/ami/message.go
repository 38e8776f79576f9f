package ami

// Field is one header of an action or a message.
type Field struct {
	Name  string
	Value string
}

// F is shorthand for Field{name, value}.
func F(name, value string) Field { return Field{Name: name, Value: value} }

func fieldsOf(m *message) []Field {
	if m == nil {
		return nil
	}
	h := m.g.Headers()
	out := make([]Field, len(h))
	for i, f := range h {
		out[i] = Field(f)
	}
	return out
}

// Response is the answer to one action. For a list action (DBGetTree,
// DBGet, …, answered with "EventList: start") it also holds the list's
// events, collected up to the Complete event.
type Response struct {
	msg      *message
	events   []Event
	complete *message
}

// Success reports "Response: Success". Note that a Command answered with
// Error still says "Message: Command output follows".
func (r Response) Success() bool { return r.msg != nil && r.msg.isSuccess() }

// Field returns the first value of a header (case-insensitive), or "".
func (r Response) Field(name string) string {
	if r.msg == nil {
		return ""
	}
	return r.msg.get(name)
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
	return r.msg.values("Output")
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
type Event struct{ msg *message }

// Name is the Event header.
func (e Event) Name() string { return e.Field("Event") }

// Field returns the first value of a header (case-insensitive), or "".
func (e Event) Field(name string) string {
	if e.msg == nil {
		return ""
	}
	return e.msg.get(name)
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
