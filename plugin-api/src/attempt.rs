//! Ready-made [`Attempt`]s for the common shapes of upstream work, so a
//! provider writes only what its payloads demand: the request and the parse.

use crate::{Attempt, Done, Next, Output, ProviderError, UpstreamRequest, UpstreamResponse};

/// One request; its response is parsed into the answer.
pub fn single<F>(request: UpstreamRequest, parse: F) -> Box<dyn Attempt>
where
    F: FnMut(UpstreamResponse<'_>) -> Result<Done, ProviderError> + Send + 'static,
{
    Box::new(Single {
        request: Some(request),
        parse,
    })
}

struct Single<F> {
    request: Option<UpstreamRequest>,
    parse: F,
}

impl<F> Attempt for Single<F>
where
    F: FnMut(UpstreamResponse<'_>) -> Result<Done, ProviderError> + Send,
{
    fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        match (response, self.request.take()) {
            (None, Some(request)) => Ok(Next::Fetch(request)),
            (Some(response), None) => (self.parse)(response).map(Next::Done),
            _ => Err(out_of_order()),
        }
    }
}

/// An attempt whose set-up may fail, e.g. on a value that cannot be a path
/// segment ([`UpstreamRequest::segment`]): an `Err` fails the attempt at its
/// first step, before any request.
///
/// ```
/// # use plugin_api::{attempt, Attempt, Done, Output, ProviderError, UpstreamRequest};
/// fn begin(base_url: &str, username: &str) -> Box<dyn Attempt> {
///     attempt::start(|| {
///         let request = UpstreamRequest::get(base_url, "/users").segment(username)?;
///         Ok(attempt::single(request, |_| Ok(Done::last(Output::Posts(vec![])))))
///     })
/// }
/// ```
pub fn start<F>(set_up: F) -> Box<dyn Attempt>
where
    F: FnOnce() -> Result<Box<dyn Attempt>, ProviderError>,
{
    set_up().unwrap_or_else(fail)
}

/// An attempt that fails at once, e.g. on input this platform refuses.
pub fn fail(error: ProviderError) -> Box<dyn Attempt> {
    Box::new(Failed(Some(error)))
}

struct Failed(Option<ProviderError>);

impl Attempt for Failed {
    fn step(&mut self, _: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        Err(self.0.take().unwrap_or_else(out_of_order))
    }
}

fn out_of_order() -> ProviderError {
    ProviderError::bad_response("attempt stepped out of order")
}

/// One upstream page of an offset-paged list.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// The upstream's cursor for the next page; `None` when it has no more.
    pub next: Option<u64>,
}

/// An exact-size list read from an upstream that pages by offset and gives
/// at most `max_page` items a call: keeps asking until `want` items are in
/// hand or the upstream runs out.
pub struct OffsetPaged<T, R, P, W> {
    want: usize,
    max_page: usize,
    offset: u64,
    items: Vec<T>,
    /// The page size asked for in flight, or `None` before the first request.
    asked: Option<usize>,
    request: R,
    parse: P,
    wrap: W,
}

/// Starts an [`OffsetPaged`] list at the upstream cursor `start` (an offset
/// this provider issued earlier; `None` for the first page).
///
/// `request(offset, page_size)` builds one page's request, `parse` reads a
/// page, `wrap` turns the items into the answer. Type `parse`'s argument
/// (`|response: UpstreamResponse<'_>| ...`): closures taking a borrowed
/// argument need it spelled out to infer their higher-ranked type.
pub fn offset_paged<T, R, P, W>(
    want: u32,
    max_page: u32,
    start: Option<&str>,
    request: R,
    parse: P,
    wrap: W,
) -> Box<dyn Attempt>
where
    T: Send + 'static,
    R: FnMut(u64, usize) -> UpstreamRequest + Send + 'static,
    P: FnMut(UpstreamResponse<'_>) -> Result<Page<T>, ProviderError> + Send + 'static,
    W: FnMut(Vec<T>) -> Output + Send + 'static,
{
    let offset = match start.map(str::parse::<u64>) {
        None => 0,
        Some(Ok(offset)) => offset,
        Some(Err(_)) => return fail(ProviderError::bad_response("cursor is not an offset")),
    };
    Box::new(OffsetPaged {
        want: want as usize,
        max_page: max_page.max(1) as usize,
        offset,
        items: Vec::with_capacity(want as usize),
        asked: None,
        request,
        parse,
        wrap,
    })
}

impl<T, R, P, W> OffsetPaged<T, R, P, W>
where
    R: FnMut(u64, usize) -> UpstreamRequest,
    W: FnMut(Vec<T>) -> Output,
{
    fn fetch_next(&mut self) -> Next {
        let size = (self.want - self.items.len()).min(self.max_page);
        self.asked = Some(size);
        Next::Fetch((self.request)(self.offset, size))
    }

    fn finish(&mut self, next_cursor: Option<u64>) -> Next {
        Next::Done(Done {
            output: (self.wrap)(std::mem::take(&mut self.items)),
            next_cursor: next_cursor.map(|c| c.to_string()),
        })
    }
}

impl<T, R, P, W> Attempt for OffsetPaged<T, R, P, W>
where
    T: Send,
    R: FnMut(u64, usize) -> UpstreamRequest + Send,
    P: FnMut(UpstreamResponse<'_>) -> Result<Page<T>, ProviderError> + Send,
    W: FnMut(Vec<T>) -> Output + Send,
{
    fn step(&mut self, response: Option<UpstreamResponse<'_>>) -> Result<Next, ProviderError> {
        let Some(response) = response else {
            return match self.asked {
                None => Ok(self.fetch_next()),
                Some(_) => Err(out_of_order()),
            };
        };
        if self.asked.is_none() {
            return Err(out_of_order());
        }
        let page = (self.parse)(response)?;
        let room = self.want - self.items.len();
        let returned = page.items.len();
        self.items.extend(page.items.into_iter().take(room));
        let taken = returned.min(room);
        // When we keep the whole page the upstream's own cursor is right;
        // when we cut it short, the next page starts right after what we
        // kept. Offsets are upstream numbers: one past `u64::MAX` means
        // there is nothing more we could ask for.
        let next = if taken < returned {
            self.offset.checked_add(taken as u64)
        } else {
            page.next
        };
        // A cursor that does not move forward would repeat pages, here or
        // through the caller's next request: it ends the listing. So does an
        // empty page, whatever it claims.
        let next = next.filter(|&next| next > self.offset && returned > 0);
        match next {
            Some(next) if self.items.len() < self.want => {
                self.offset = next;
                Ok(self.fetch_next())
            }
            next => Ok(self.finish(next)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Comment, ErrorKind};

    fn comment(n: u64) -> Comment {
        Comment {
            id: n.to_string(),
            text: String::new(),
            likes: 0,
            replies: None,
            created_at: None,
            author: None,
        }
    }

    /// Drives a paged list against an imaginary upstream of `total` items,
    /// recording each (offset, size) asked.
    fn run(want: u32, total: u64, start: Option<&str>) -> (Vec<(u64, usize)>, Done) {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        let mut attempt = offset_paged(
            want,
            50,
            start,
            move |offset, size| {
                log.lock().unwrap().push((offset, size));
                UpstreamRequest::get("http://u", "/c")
                    .query("cursor", offset)
                    .query("count", size)
            },
            move |r: UpstreamResponse<'_>| {
                let text = std::str::from_utf8(r.body).unwrap();
                let (offset, size): (u64, u64) = serde_json::from_str(text).unwrap();
                let end = (offset + size).min(total);
                Ok(Page {
                    items: (offset..end).map(comment).collect(),
                    next: (end < total).then_some(end),
                })
            },
            Output::Comments,
        );
        let mut response: Option<Vec<u8>> = None;
        for _ in 0..16 {
            let next = attempt
                .step(
                    response
                        .as_deref()
                        .map(|b| UpstreamResponse::new(200, &[], b)),
                )
                .unwrap();
            match next {
                Next::Fetch(_) => {
                    let (o, s) = *asked.lock().unwrap().last().unwrap();
                    response = Some(format!("[{o},{s}]").into_bytes());
                }
                Next::Done(done) => return (asked.lock().unwrap().clone(), done),
            }
        }
        panic!("did not finish in 16 steps");
    }

    #[test]
    fn pages_until_exact_count() {
        let (asked, done) = run(120, 811, None);
        assert_eq!(asked, vec![(0, 50), (50, 50), (100, 20)]);
        let Output::Comments(items) = done.output else {
            panic!()
        };
        assert_eq!(items.len(), 120);
        assert_eq!(items[119].id, "119");
        assert_eq!(done.next_cursor.as_deref(), Some("120"));
    }

    #[test]
    fn stops_at_the_end_and_resumes_from_a_cursor() {
        let (asked, done) = run(20, 30, Some("15"));
        assert_eq!(asked, vec![(15, 20)]);
        assert_eq!(done.next_cursor, None);
        let Output::Comments(items) = done.output else {
            panic!()
        };
        assert_eq!(items.len(), 15);
    }

    /// Drives a paged list through hand-written upstream pages, each a
    /// list of item numbers and the upstream's next cursor.
    fn run_pages(want: u32, start: Option<&str>, pages: &[(&[u64], Option<u64>)]) -> Done {
        let mut pages = pages.iter();
        let mut attempt = offset_paged(
            want,
            50,
            start,
            |offset, size| {
                UpstreamRequest::get("http://u", "/c")
                    .query("cursor", offset)
                    .query("count", size)
            },
            |r: UpstreamResponse<'_>| {
                let (items, next): (Vec<u64>, Option<u64>) =
                    serde_json::from_slice(r.body).unwrap();
                Ok(Page {
                    items: items.into_iter().map(comment).collect(),
                    next,
                })
            },
            Output::Comments,
        );
        let mut body: Option<Vec<u8>> = None;
        loop {
            let response = body.as_deref().map(|b| UpstreamResponse::new(200, &[], b));
            match attempt.step(response).unwrap() {
                Next::Done(done) => return done,
                Next::Fetch(_) => {
                    let page = pages
                        .next()
                        .expect("asked for more pages than the test has");
                    body = Some(serde_json::to_vec(page).unwrap());
                }
            }
        }
    }

    fn ids(done: &Done) -> Vec<String> {
        let Output::Comments(items) = &done.output else {
            panic!()
        };
        items.iter().map(|c| c.id.clone()).collect()
    }

    #[test]
    fn a_cursor_that_does_not_advance_ends_the_listing() {
        // `"cursor": 0, "has_more": 1` on a full first page.
        let done = run_pages(2, None, &[(&[1, 2], Some(0))]);
        assert_eq!(done.next_cursor, None);
        // The same, resuming at 40: a cursor back at 40 or before it.
        for back in [40, 7] {
            let done = run_pages(2, Some("40"), &[(&[41, 42], Some(back))]);
            assert_eq!(done.next_cursor, None, "{back}");
        }
        // Short of `want`, a stuck cursor stops the paging too.
        let done = run_pages(5, Some("40"), &[(&[41, 42], Some(40))]);
        assert_eq!(ids(&done), ["41", "42"]);
        assert_eq!(done.next_cursor, None);
    }

    #[test]
    fn an_offset_past_u64_max_ends_the_listing_instead_of_wrapping() {
        // The upstream jumps to u64::MAX, then floods the page: the offset
        // after the kept items cannot be written, so there is no next page.
        let done = run_pages(
            3,
            None,
            &[(&[1], Some(u64::MAX)), (&[2, 3, 4, 5], Some(u64::MAX))],
        );
        assert_eq!(ids(&done), ["1", "2", "3"]);
        assert_eq!(done.next_cursor, None);
    }

    #[test]
    fn single_and_fail_follow_the_protocol() {
        let mut a = single(UpstreamRequest::get("http://u", "/"), |_| {
            Ok(Done::last(Output::Comments(vec![])))
        });
        assert!(matches!(a.step(None), Ok(Next::Fetch(_))));
        assert!(a.step(None).is_err());
        let mut f = fail(ProviderError::not_found("x"));
        assert_eq!(f.step(None).unwrap_err().kind(), ErrorKind::NotFound);
    }
}
