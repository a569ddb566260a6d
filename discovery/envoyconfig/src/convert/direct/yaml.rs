//! YAML read for the fast path (`direct`): the events of the parser the full path reads with
//! (`granit-parser`, under `serde-saphyr`) made into a value tree, about three times cheaper
//! than through `serde-saphyr`'s deserializer. Only the plain YAML a config is written in:
//! one document, no anchors, aliases, tags or directives, nested at most as deep as the full
//! path allows. Anything else is declined, for the full path to read.
//!
//! A plain scalar keeps its text (`Node::Plain`): what it stands for depends on the field it
//! fills, as it does in the full path, which reads it as the field asks (see `node.rs`).

use std::borrow::Cow;

use granit_parser::{Event, Parser, ScalarStyle};

use super::node::{Node, plain_is_text};

/// As deep as `serde-saphyr` nests by default; deeper documents are its to refuse.
const MAX_DEPTH: usize = 64;
/// As many events as `serde-saphyr` reads by default.
const MAX_EVENTS: usize = 1_000_000;

pub(super) fn read(text: &str) -> Option<Node<'_>> {
    let mut events = Events {
        parser: Parser::new_from_str(text),
        count: 0,
    };
    if !matches!(events.next()?, Event::StreamStart) {
        return None;
    }
    // One document, without a `%YAML` directive.
    if !matches!(events.next()?, Event::DocumentStart(_, None)) {
        return None;
    }
    let first = events.next()?;
    let node = node(&mut events, first, 0)?;
    if !matches!(events.next()?, Event::DocumentEnd) || !matches!(events.next()?, Event::StreamEnd)
    {
        return None;
    }
    Some(node)
}

struct Events<'a> {
    parser: Parser<'a, granit_parser::StrInput<'a>>,
    count: usize,
}

impl<'a> Events<'a> {
    /// The next event that is not a comment; `None` at an error or past the budget.
    fn next(&mut self) -> Option<Event<'a>> {
        loop {
            self.count += 1;
            if self.count > MAX_EVENTS {
                return None;
            }
            match self.parser.next()?.ok()?.0 {
                Event::Comment(..) => continue,
                event => return Some(event),
            }
        }
    }
}

fn node<'a>(events: &mut Events<'a>, event: Event<'a>, depth: usize) -> Option<Node<'a>> {
    match event {
        Event::Scalar(text, style, 0, None) => Some(match style {
            ScalarStyle::Plain => Node::Plain(text),
            _ => Node::Str(text),
        }),
        Event::SequenceStart(_, 0, None) if depth < MAX_DEPTH => {
            let mut items = Vec::new();
            loop {
                match events.next()? {
                    Event::SequenceEnd => return Some(Node::List(items)),
                    event => items.push(node(events, event, depth + 1)?),
                }
            }
        }
        Event::MappingStart(_, 0, None) if depth < MAX_DEPTH => {
            let mut entries = Vec::new();
            loop {
                let key = match events.next()? {
                    Event::MappingEnd => return Some(Node::Map(entries)),
                    Event::Scalar(text, style, 0, None) => key(text, style)?,
                    _ => return None,
                };
                let value = events.next()?;
                entries.push((key, node(events, value, depth + 1)?));
            }
        }
        _ => None,
    }
}

/// A mapping key: quoted, or plain and plainly text (a plain `1`, `true` or `~` is a number,
/// a boolean or a null to the full path, and `<<` a merge).
fn key(text: Cow<'_, str>, style: ScalarStyle) -> Option<Cow<'_, str>> {
    let plain_text = plain_is_text(&text) && text != "<<";
    (style != ScalarStyle::Plain || plain_text).then_some(text)
}
