//! The JSON this crate writes, in serde_json's one exact form: written
//! fast, and read back only in that form.
//!
//! A plugin's answer crosses the boundary as JSON that this crate writes
//! with serde_json (see [`ffi`](crate::ffi)), and the host answers its
//! caller with that data as JSON again. Decoding the answer checks it
//! against the schema, but serde's decoding also takes forms serde_json
//! never writes (white space, another field order, an absent optional
//! field, a `\u0041` for an `A`), so the decoded text could not simply be
//! passed on. This reader takes only serde_json's own form: no white space,
//! every field of a struct present and in declared order, strings escaped
//! exactly as serde_json escapes them, integers without a sign (but `-` on
//! negatives) or a leading zero. So a value that reads here is one that
//! serde_json writes, byte for byte, as the text it was read from, and the
//! host passes the text on instead of writing it anew. Any other text is
//! refused, and the caller decodes it the general way (same value, more
//! work).
//!
//! It reads what the schema is made of (structs, newtype variants,
//! sequences, options, strings, integers, booleans) and refuses the rest
//! of serde's data model.
//!
//! [`to_string`] writes those same kinds of values, byte for byte as
//! serde_json writes them (tested), at a fraction of its cost: runs of
//! plain text are copied whole rather than looked at one byte at a time.
//! Anything else fails, and the caller writes it with serde_json.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, Visitor};
use serde::ser::{self, Serialize};
use serde::Deserialize;

/// Reads `text`, which must be all of one value in serde_json's form.
pub fn from_str<'de, T: Deserialize<'de>>(text: &'de str) -> Result<T, Error> {
    let mut reader = Reader { text, at: 0 };
    let value = T::deserialize(&mut reader)?;
    if reader.at != text.len() {
        return Err(reader.refused("text after the value"));
    }
    Ok(value)
}

/// `value` as serde_json writes it, into `room` bytes to begin with.
pub fn to_string<T: Serialize + ?Sized>(value: &T, room: usize) -> Result<String, Error> {
    let mut out = String::with_capacity(room);
    write(&mut out, value)?;
    Ok(out)
}

/// Appends `value` to `out` as serde_json writes it; on an error, what was
/// written of it stays.
pub fn write<O: Text + ?Sized, T: Serialize + ?Sized>(out: &mut O, value: &T) -> Result<(), Error> {
    value.serialize(&mut Writer { out })
}

/// Where JSON is written: text, or bytes that stay text.
pub trait Text {
    fn push_text(&mut self, text: &str);
}

impl Text for String {
    fn push_text(&mut self, text: &str) {
        self.push_str(text);
    }
}

impl Text for Vec<u8> {
    fn push_text(&mut self, text: &str) {
        self.extend_from_slice(text.as_bytes());
    }
}

/// Appends `text` as a JSON string, escaped as serde_json escapes it: `"`,
/// `\` and control characters only.
pub fn write_str<O: Text + ?Sized>(out: &mut O, text: &str) {
    out.push_text("\"");
    let bytes = text.as_bytes();
    let mut at = 0;
    loop {
        let plain_end = plain_until(bytes, at);
        out.push_text(&text[at..plain_end]);
        let Some(&byte) = bytes.get(plain_end) else {
            break;
        };
        match byte {
            b'"' => out.push_text("\\\""),
            b'\\' => out.push_text("\\\\"),
            b'\n' => out.push_text("\\n"),
            b'\r' => out.push_text("\\r"),
            b'\t' => out.push_text("\\t"),
            0x08 => out.push_text("\\b"),
            0x0c => out.push_text("\\f"),
            control => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let escape = [
                    b'\\',
                    b'u',
                    b'0',
                    b'0',
                    HEX[usize::from(control >> 4)],
                    HEX[usize::from(control & 0xf)],
                ];
                out.push_text(std::str::from_utf8(&escape).expect("ASCII"));
            }
        }
        at = plain_end + 1;
    }
    out.push_text("\"");
}

/// Why a text was refused: not the form serde_json writes, or a value the
/// type refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Error {
        Error(message.to_string())
    }
}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(message: T) -> Error {
        Error(message.to_string())
    }
}

struct Reader<'de> {
    text: &'de str,
    /// The next byte to read.
    at: usize,
}

impl<'de> Reader<'de> {
    fn refused(&self, what: &str) -> Error {
        Error(format!("not serde_json's form at byte {}: {what}", self.at))
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Result<(), Error> {
        if self.peek() == Some(byte) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.refused("unexpected character"))
        }
    }

    fn expect_text(&mut self, expected: &str) -> Result<(), Error> {
        if self.text.as_bytes()[self.at..].starts_with(expected.as_bytes()) {
            self.at += expected.len();
            Ok(())
        } else {
            Err(self.refused("unexpected text"))
        }
    }

    /// `"…"` as serde_json escapes it: only `"`, `\` and control
    /// characters, as `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t` or (the
    /// other control characters) `\u00xx` in lower-case hex.
    fn string(&mut self) -> Result<Cow<'de, str>, Error> {
        self.expect(b'"')?;
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut owned: Option<String> = None;
        // Where the run of plain characters not yet copied to `owned` began.
        let mut run = start;
        loop {
            self.at = plain_until(bytes, self.at);
            match bytes.get(self.at) {
                Some(b'"') => {
                    let end = self.at;
                    self.at += 1;
                    // Both ends are ASCII, so both are character boundaries.
                    return Ok(match owned {
                        None => Cow::Borrowed(&self.text[start..end]),
                        Some(mut text) => {
                            text.push_str(&self.text[run..end]);
                            Cow::Owned(text)
                        }
                    });
                }
                Some(b'\\') => {
                    let text = owned.get_or_insert_with(String::new);
                    text.push_str(&self.text[run..self.at]);
                    let escaped = match bytes.get(self.at + 1) {
                        Some(b'"') => '"',
                        Some(b'\\') => '\\',
                        Some(b'b') => '\u{8}',
                        Some(b'f') => '\u{c}',
                        Some(b'n') => '\n',
                        Some(b'r') => '\r',
                        Some(b't') => '\t',
                        Some(b'u') => {
                            let control = bytes
                                .get(self.at + 2..self.at + 6)
                                .and_then(control_escape)
                                .ok_or_else(|| self.refused("an escape serde_json never writes"))?;
                            self.at += 4;
                            char::from(control)
                        }
                        _ => return Err(self.refused("an escape serde_json never writes")),
                    };
                    text.push(escaped);
                    self.at += 2;
                    run = self.at;
                }
                // A control character as it is, or the text ends.
                _ => return Err(self.refused("an unescaped control character")),
            }
        }
    }

    /// Digits without a leading zero (but `0` itself).
    fn unsigned(&mut self) -> Result<u64, Error> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut value: u64 = 0;
        while let Some(digit) = bytes.get(self.at).filter(|b| b.is_ascii_digit()) {
            value = value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(digit - b'0')))
                .ok_or_else(|| self.refused("an integer out of range"))?;
            self.at += 1;
        }
        match self.at - start {
            0 => Err(self.refused("no digits")),
            1 => Ok(value),
            _ if bytes[start] == b'0' => Err(self.refused("a leading zero")),
            _ => Ok(value),
        }
    }

    fn signed(&mut self) -> Result<i64, Error> {
        if self.peek() != Some(b'-') {
            return i64::try_from(self.unsigned()?)
                .map_err(|_| self.refused("an integer out of range"));
        }
        self.at += 1;
        match self.unsigned()? {
            0 => Err(self.refused("a negative zero")),
            magnitude => 0i64
                .checked_sub_unsigned(magnitude)
                .ok_or_else(|| self.refused("an integer out of range")),
        }
    }
}

/// The first byte from `at` that is not plain string content: `"`, `\`, a
/// control character, or the end. Eight bytes at a time while none is.
fn plain_until(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero_byte = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_ne_bytes(chunk.try_into().expect("eight bytes"));
        // A byte below 0x20, or equal to `"` or `\`: the high bit of its
        // lane (or of a lane after it, which only stops the fast path
        // early) is set.
        let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
        let special = below_space
            | has_zero_byte(word ^ (ONES * u64::from(b'"')))
            | has_zero_byte(word ^ (ONES * u64::from(b'\\')));
        if special != 0 {
            break;
        }
        at += 8;
    }
    while let Some(&byte) = bytes.get(at) {
        if byte == b'"' || byte == b'\\' || byte < 0x20 {
            break;
        }
        at += 1;
    }
    at
}

/// The control character of `00xx` (lower-case hex), when serde_json
/// writes that character so: those with a short escape it writes short.
fn control_escape(hex: &[u8]) -> Option<u8> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    let [b'0', b'0', high, low] = *hex else {
        return None;
    };
    let byte = digit(high)? << 4 | digit(low)?;
    let short = matches!(byte, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d);
    (byte < 0x20 && !short).then_some(byte)
}

macro_rules! refuse {
    ($($method:ident)*) => {
        $(fn $method<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
            Err(self.refused("a kind of value this schema never writes"))
        })*
    };
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Error;

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.peek() == Some(b't') {
            self.expect_text("true")?;
            visitor.visit_bool(true)
        } else {
            self.expect_text("false")?;
            visitor.visit_bool(false)
        }
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(self.unsigned()?)
    }

    fn deserialize_u32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_u8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_u64(visitor)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_i64(self.signed()?)
    }

    fn deserialize_i32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }

    fn deserialize_i16<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }

    fn deserialize_i8<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_i64(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.string()? {
            Cow::Borrowed(text) => visitor.visit_borrowed_str(text),
            Cow::Owned(text) => visitor.visit_string(text),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.peek() == Some(b'n') {
            self.expect_text("null")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.expect(b'[')?;
        let value = visitor.visit_seq(Items {
            reader: &mut *self,
            first: true,
        })?;
        self.expect(b']')?;
        Ok(value)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.expect(b'{')?;
        let value = visitor.visit_map(Fields {
            reader: &mut *self,
            fields,
            next: 0,
        })?;
        self.expect(b'}')?;
        Ok(value)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.expect(b'{')?;
        let value = visitor.visit_enum(Variant { reader: &mut *self })?;
        self.expect(b'}')?;
        Ok(value)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.deserialize_str(visitor)
    }

    refuse! {
        deserialize_any deserialize_f32 deserialize_f64 deserialize_char deserialize_bytes
        deserialize_byte_buf deserialize_unit deserialize_map deserialize_ignored_any
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(self.refused("a kind of value this schema never writes"))
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(self.refused("a kind of value this schema never writes"))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(self.refused("a kind of value this schema never writes"))
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(self.refused("a kind of value this schema never writes"))
    }
}

/// A sequence's items, `,` between them.
struct Items<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.reader.peek() == Some(b']') {
            return Ok(None);
        }
        if !std::mem::take(&mut self.first) {
            self.reader.expect(b',')?;
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

/// A struct's fields: each of `fields`, in that order, and no other.
struct Fields<'r, 'de> {
    reader: &'r mut Reader<'de>,
    fields: &'static [&'static str],
    next: usize,
}

impl<'de> de::MapAccess<'de> for Fields<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(&name) = self.fields.get(self.next) else {
            return Ok(None);
        };
        if self.next > 0 {
            self.reader.expect(b',')?;
        }
        self.next += 1;
        // Field names are plain: serde_json writes them as they are.
        self.reader.expect(b'"')?;
        self.reader.expect_text(name)?;
        self.reader.expect_text("\":")?;
        seed.deserialize(BorrowedStrDeserializer::new(name))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(&mut *self.reader)
    }
}

/// An enum's value, as serde_json writes a newtype variant:
/// `{"variant":value}` (the braces are the caller's).
struct Variant<'r, 'de> {
    reader: &'r mut Reader<'de>,
}

impl<'r, 'de> de::EnumAccess<'de> for Variant<'r, 'de> {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let Cow::Borrowed(name) = self.reader.string()? else {
            return Err(self.reader.refused("an escaped variant name"));
        };
        self.reader.expect(b':')?;
        let variant = seed.deserialize(BorrowedStrDeserializer::new(name))?;
        Ok((variant, self))
    }
}

impl<'de> de::VariantAccess<'de> for Variant<'_, 'de> {
    type Error = Error;

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(&mut *self.reader)
    }

    fn unit_variant(self) -> Result<(), Error> {
        Err(self.reader.refused("a unit variant inside braces"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, Error> {
        Err(self
            .reader
            .refused("a kind of variant this schema never writes"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(self
            .reader
            .refused("a kind of variant this schema never writes"))
    }
}

struct Writer<'o, O: ?Sized> {
    out: &'o mut O,
}

fn unwritten() -> Error {
    Error("a kind of value this schema never writes".into())
}

impl<O: Text + ?Sized> Writer<'_, O> {
    fn integer(&mut self, value: impl itoa::Integer) {
        self.out.push_text(itoa::Buffer::new().format(value));
    }
}

macro_rules! refuse_to_write {
    ($($method:ident($($arg:ty),*))*) => {
        $(fn $method(self, $(_: $arg),*) -> Result<(), Error> {
            Err(unwritten())
        })*
    };
}

impl<'w, 'o, O: Text + ?Sized> ser::Serializer for &'w mut Writer<'o, O> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Elements<'w, 'o, O>;
    type SerializeTuple = ser::Impossible<(), Error>;
    type SerializeTupleStruct = ser::Impossible<(), Error>;
    type SerializeTupleVariant = ser::Impossible<(), Error>;
    type SerializeMap = ser::Impossible<(), Error>;
    type SerializeStruct = Elements<'w, 'o, O>;
    type SerializeStructVariant = ser::Impossible<(), Error>;

    fn serialize_bool(self, value: bool) -> Result<(), Error> {
        self.out.push_text(if value { "true" } else { "false" });
        Ok(())
    }

    fn serialize_u8(self, value: u8) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u16(self, value: u16) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u32(self, value: u32) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_u64(self, value: u64) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i8(self, value: i8) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i16(self, value: i16) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i32(self, value: i32) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_i64(self, value: i64) -> Result<(), Error> {
        self.integer(value);
        Ok(())
    }

    fn serialize_str(self, value: &str) -> Result<(), Error> {
        write_str(self.out, value);
        Ok(())
    }

    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> Result<(), Error> {
        self.serialize_str(&value.to_string())
    }

    fn serialize_none(self) -> Result<(), Error> {
        self.out.push_text("null");
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.out.push_text("{");
        write_str(self.out, variant);
        self.out.push_text(":");
        value.serialize(&mut *self)?;
        self.out.push_text("}");
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Elements<'w, 'o, O>, Error> {
        self.out.push_text("[");
        Ok(Elements {
            writer: self,
            first: true,
        })
    }

    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Elements<'w, 'o, O>, Error> {
        self.out.push_text("{");
        Ok(Elements {
            writer: self,
            first: true,
        })
    }

    refuse_to_write! {
        serialize_u128(u128) serialize_i128(i128) serialize_f32(f32) serialize_f64(f64)
        serialize_char(char) serialize_bytes(&[u8]) serialize_unit()
        serialize_unit_struct(&'static str)
        serialize_unit_variant(&'static str, u32, &'static str)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _value: &T,
    ) -> Result<(), Error> {
        Err(unwritten())
    }

    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Error> {
        Err(unwritten())
    }

    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Error> {
        Err(unwritten())
    }

    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(unwritten())
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Err(unwritten())
    }

    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(unwritten())
    }
}

/// A sequence's items or a struct's fields, `,` between them.
struct Elements<'w, 'o, O: ?Sized> {
    writer: &'w mut Writer<'o, O>,
    first: bool,
}

impl<O: Text + ?Sized> Elements<'_, '_, O> {
    fn separate(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.writer.out.push_text(",");
        }
    }
}

impl<O: Text + ?Sized> ser::SerializeSeq for Elements<'_, '_, O> {
    type Ok = ();
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.separate();
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Result<(), Error> {
        self.writer.out.push_text("]");
        Ok(())
    }
}

impl<O: Text + ?Sized> ser::SerializeStruct for Elements<'_, '_, O> {
    type Ok = ();
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.separate();
        write_str(self.writer.out, name);
        self.writer.out.push_text(":");
        value.serialize(&mut *self.writer)
    }

    fn end(self) -> Result<(), Error> {
        self.writer.out.push_text("}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Comment, Output, Post, Profile, Timestamp};

    fn profile(name: &str) -> Profile {
        Profile {
            username: name.into(),
            display_name: format!("{name} \u{1f370} \"quoted\" \\ /\n\t\u{1}\u{1f}\u{7f}"),
            followers: u64::MAX,
            verified: true,
            id: Some("6613926240453148678".into()),
            bio: None,
            following: Some(0),
            likes: Some(98_989_516),
            videos: None,
            avatar_url: Some("https://cdn.example/a~b?x=1&y=2".into()),
        }
    }

    fn post(id: &str) -> Post {
        Post {
            id: id.into(),
            text: "caption #tag \u{2028} é\r\u{8}\u{c}".into(),
            likes: 1,
            comments: 0,
            views: Some(10),
            shares: None,
            created_at: Timestamp::from_unix(1_763_700_000),
            duration_ms: Some(15_000),
            author: Some("lunabakes".into()),
        }
    }

    fn outputs() -> Vec<Output> {
        vec![
            Output::Profile(profile("lunabakes")),
            Output::Profile(Profile {
                display_name: String::new(),
                id: None,
                following: None,
                likes: None,
                avatar_url: None,
                ..profile("")
            }),
            Output::Post(post("7312345678901234567")),
            Output::Posts(vec![]),
            Output::Posts(vec![post("1"), post("2")]),
            Output::Comments(vec![Comment {
                id: "3".into(),
                text: String::new(),
                likes: 7,
                replies: None,
                created_at: None,
                author: None,
            }]),
            Output::Search(vec![profile("a"), profile("b")]),
        ]
    }

    #[test]
    fn writes_what_serde_json_writes() {
        for output in outputs() {
            assert_eq!(
                to_string(&output, 0),
                Ok(serde_json::to_string(&output).unwrap())
            );
        }
        for byte in 0u8..=0x7f {
            let text = format!("a{}b", char::from(byte));
            let mut written = String::new();
            write_str(&mut written, &text);
            assert_eq!(written, serde_json::to_string(&text).unwrap(), "{byte:#x}");
        }
        // Kinds of values the schema never holds are refused, not guessed.
        assert!(to_string(&1.5f64, 0).is_err());
        assert!(to_string(&std::collections::BTreeMap::from([("a", 1)]), 0).is_err());
    }

    #[test]
    fn reads_back_what_serde_json_writes() {
        for output in outputs() {
            let text = serde_json::to_string(&output).unwrap();
            assert_eq!(from_str::<Output>(&text), Ok(output), "{text}");
        }
    }

    /// Every text that reads is the one serde_json writes for its value.
    fn reads_only_as_written(text: &str) {
        if let Ok(output) = from_str::<Output>(text) {
            assert_eq!(serde_json::to_string(&output).unwrap(), text);
        }
    }

    #[test]
    fn refuses_every_other_form_of_the_same_value() {
        let written = serde_json::to_string(&Output::Profile(profile("luna"))).unwrap();
        let other_forms = [
            // White space.
            written.replacen(":", ": ", 1),
            format!("{written} "),
            format!(" {written}"),
            written.replacen(",", " ,", 1),
            // Another field order, a field left out, a field twice.
            written.replacen(
                r#""username":"luna","display_name""#,
                r#""display_name""#,
                1,
            ),
            written.replacen(r#","bio":null"#, "", 1),
            written.replacen(r#","bio":null"#, r#","bio":null,"bio":null"#, 1),
            written.replacen(r#","bio":null"#, r#","extra":null,"bio":null"#, 1),
            // Escapes serde_json never writes.
            written.replacen("luna", r"\u006cuna", 1),
            written.replacen(r"\n", r"\u000a", 1),
            written.replacen(r"\u0001", r"\u0001".to_uppercase().as_str(), 1),
            written.replacen("/", r"\/", 1),
            written.replacen('\u{1f370}', r"\ud83c\udf70", 1),
            // Numbers in another form.
            written.replacen(r#""following":0"#, r#""following":00"#, 1),
            written.replacen(r#""following":0"#, r#""following":-0"#, 1),
            written.replacen(r#""following":0"#, r#""following":0.0"#, 1),
            written.replacen(r#""likes":98989516"#, r#""likes":9.8989516e7"#, 1),
            written.replacen(r#""likes":98989516"#, r#""likes":098989516"#, 1),
            written.replacen(r#""likes":98989516"#, r#""likes":"98989516""#, 1),
            // Past the range, and other shapes.
            written.replacen("18446744073709551615", "18446744073709551616", 1),
            written.replacen(r#""verified":true"#, r#""verified":1"#, 1),
            written.replacen("{\"profile\":", "{\"Profile\":", 1),
            written.replacen("{\"profile\":", "{\"pro\\u0066ile\":", 1),
            format!("{written}{written}"),
            written[..written.len() - 1].to_owned(),
            String::new(),
            "null".to_owned(),
            r#""profile""#.to_owned(),
        ];
        for text in &other_forms {
            assert_ne!(text, &written, "a test case that changes nothing");
            assert!(from_str::<Output>(text).is_err(), "read: {text}");
        }
    }

    #[test]
    fn every_control_character_reads_only_in_its_written_escape() {
        for byte in 0u8..0x20 {
            let text = serde_json::to_string(&Output::Post(Post {
                text: char::from(byte).to_string(),
                ..post("1")
            }))
            .unwrap();
            reads_only_as_written(&text);
            assert!(from_str::<Output>(&text).is_ok(), "{text}");
            // The raw character, and every \u form of it.
            let written_escape = serde_json::to_string(&char::from(byte).to_string()).unwrap();
            let written_escape = &written_escape[1..written_escape.len() - 1];
            for other in [
                char::from(byte).to_string(),
                format!("\\u{byte:04x}"),
                format!("\\u{byte:04X}"),
            ] {
                if other != written_escape {
                    let text = text.replacen(written_escape, &other, 1);
                    assert!(from_str::<Output>(&text).is_err(), "read: {text:?}");
                }
            }
        }
    }

    #[test]
    fn strings_long_and_short_around_every_special_byte() {
        // Runs that cross the eight-byte steps of the fast path at every
        // offset, with a special byte at each place.
        for len in 0..20 {
            for at in 0..=len {
                for special in ['"', '\\', '\n', '\u{1}', 'é'] {
                    let mut text: String = "x".repeat(len);
                    text.insert(at, special);
                    let written = serde_json::to_string(&Output::Post(Post {
                        text: text.clone(),
                        ..post("1")
                    }))
                    .unwrap();
                    let Output::Post(read) = from_str::<Output>(&written).unwrap() else {
                        panic!("another variant");
                    };
                    assert_eq!(read.text, text);
                }
            }
        }
    }

    #[test]
    fn signed_integers_read_in_their_one_form() {
        for (text, value) in [("0", 0i64), ("-1", -1), ("-9223372036854775808", i64::MIN)] {
            assert_eq!(from_str::<i64>(text), Ok(value));
            assert_eq!(serde_json::to_string(&value).unwrap(), text);
        }
        for text in ["-0", "+1", "01", "-01", "9223372036854775808", "-", ""] {
            assert!(from_str::<i64>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_value_the_schema_refuses_is_refused() {
        let written = serde_json::to_string(&Output::Post(post("1"))).unwrap();
        let bad_time = written.replacen("2025-11-21T04:40:00Z", "2025-13-21T04:40:00Z", 1);
        assert_ne!(bad_time, written);
        assert!(from_str::<Output>(&bad_time).is_err());
    }
}
