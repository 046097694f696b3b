//! The `posts` endpoint. P2 lists a user's videos by `sec_uid`, which only
//! P1 gives, so a first page takes two requests. The cursor handed out
//! carries the `sec_uid` along with P2's `max_cursor`, so every later page
//! takes one.

use std::fmt;
use std::sync::Arc;

use plugin_api::{attempt, Attempt, Done, Next, Output, ProviderError, UpstreamResponse};

use crate::wire::{PostsBody, ProfileBody};
use crate::Upstream;

/// Starts a `posts` attempt: from P1 on a first page, from P2 with a cursor.
pub(crate) fn begin(
    upstream: Arc<Upstream>,
    username: String,
    count: u32,
    cursor: Option<&str>,
) -> Box<dyn Attempt> {
    let stage = match cursor.map(Cursor::parse) {
        None => Stage::Start { username },
        Some(Some(cursor)) => Stage::Resume(cursor),
        Some(None) => return attempt::fail(ProviderError::bad_response("unreadable posts cursor")),
    };
    Box::new(Posts {
        upstream,
        count,
        stage,
    })
}

/// Where the next page of a user's posts starts, written
/// `{max_cursor}:{sec_uid}`. `max_cursor` is digits only, so the first `:`
/// splits it even if a `sec_uid` ever held one.
#[derive(Debug, PartialEq, Eq)]
struct Cursor {
    max_cursor: u64,
    sec_uid: String,
}

impl Cursor {
    fn parse(text: &str) -> Option<Cursor> {
        let (max_cursor, sec_uid) = text.split_once(':')?;
        let max_cursor = max_cursor.parse().ok()?;
        (!sec_uid.is_empty()).then(|| Cursor {
            max_cursor,
            sec_uid: sec_uid.to_owned(),
        })
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.max_cursor, self.sec_uid)
    }
}

struct Posts {
    upstream: Arc<Upstream>,
    count: u32,
    stage: Stage,
}

enum Stage {
    /// Nothing asked yet; P1 must find the user's `sec_uid`.
    Start { username: String },
    /// Nothing asked yet; a cursor already gave the `sec_uid`.
    Resume(Cursor),
    /// P1 in flight.
    User,
    /// P2 in flight for this `sec_uid`, from this `max_cursor`.
    Page { sec_uid: String, sent: u64 },
    /// Answered or failed; any further step is out of order.
    Finished,
}

impl Posts {
    fn fetch_page(&mut self, cursor: Cursor) -> Next {
        let request = self
            .upstream
            .posts(&cursor.sec_uid, self.count, cursor.max_cursor);
        self.stage = Stage::Page {
            sec_uid: cursor.sec_uid,
            sent: cursor.max_cursor,
        };
        Next::Fetch(request)
    }
}

impl Attempt for Posts {
    fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        match (
            std::mem::replace(&mut self.stage, Stage::Finished),
            response,
        ) {
            (Stage::Start { username }, None) => {
                self.stage = Stage::User;
                Ok(Next::Fetch(self.upstream.profile(&username)))
            }
            (Stage::Resume(cursor), None) => Ok(self.fetch_page(cursor)),
            (Stage::User, Some(response)) => {
                let user = response.json::<ProfileBody>()?.into_user()?;
                let sec_uid = user
                    .sec_uid
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| ProviderError::missing("user.sec_uid"))?;
                Ok(self.fetch_page(Cursor {
                    max_cursor: 0,
                    sec_uid,
                }))
            }
            (Stage::Page { sec_uid, sent }, Some(response)) => {
                let page = response.json::<PostsBody>()?.into_page()?;
                // The `max_cursor` just asked for would repeat this page, and
                // 0 would start the list again: either would send a caller
                // following `next_cursor` round for ever. Both end it.
                let next = page.next.filter(|&next| next != sent && next != 0);
                let next_cursor = next.map(|max_cursor| {
                    Cursor {
                        max_cursor,
                        sec_uid,
                    }
                    .to_string()
                });
                Ok(Next::Done(Done {
                    output: Output::Posts(page.items),
                    next_cursor,
                }))
            }
            _ => Err(ProviderError::bad_response("attempt stepped out of order")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_garbage() {
        let c = Cursor {
            max_cursor: 1_762_500_000_000,
            sec_uid: "MS4w:odd_-".into(),
        };
        assert_eq!(c.to_string(), "1762500000000:MS4w:odd_-");
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        for bad in [
            "",
            "12",
            ":abc",
            "12:",
            "x:abc",
            "-1:abc",
            "99999999999999999999:a",
        ] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?}");
        }
    }
}
