//! The endpoints and what they answer: `/status` and `/steps` from the cells the `Status`
//! actor renders, `/metrics`, and the probes `/healthz` and `/readyz`; `GET` only.

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use crate::metrics::{CONTENT_TYPE as METRICS_CONTENT_TYPE, Metrics};
use crate::status::{Published, SharedSteps, StepRecord};

/// The endpoints; anything else is 404, another method on them 405.
pub(super) fn routes(
    json: Published,
    metrics: Arc<Metrics>,
) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg| {
        cfg.app_data(web::Data::new(json))
            .app_data(web::Data::new(metrics))
            .service(web::resource("/status").route(web::get().to(status)))
            .service(web::resource("/steps").route(web::get().to(steps)))
            .service(web::resource("/metrics").route(web::get().to(render_metrics)))
            .service(web::resource("/healthz").route(web::get().to(healthz)))
            .service(web::resource("/readyz").route(web::get().to(readyz)))
            .default_service(web::to(|| async {
                HttpResponse::NotFound().body("not found\n")
            }));
    }
}

async fn status(json: web::Data<Published>) -> HttpResponse {
    let body = json
        .status
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .clone();
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body)
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(json: web::Data<Published>) -> HttpResponse {
    let ready = *json
        .ready
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match ready {
        Ok(()) => HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n"),
        Err(why) => HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body(format!("not ready: {why}\n")),
    }
}

/// `/steps?from=STEP`: lets a poller fetch only what is new; unknown parameters are refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StepsQuery {
    #[serde(default)]
    from: u64,
}

async fn steps(json: web::Data<Published>, query: web::Query<StepsQuery>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(render_steps(&json.steps, query.from))
}

async fn render_metrics(metrics: web::Data<Arc<Metrics>>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(METRICS_CONTENT_TYPE)
        .body(metrics.render())
}

/// The records of steps `>= from`, as a JSON array.
fn render_steps(steps: &SharedSteps, from: u64) -> String {
    let steps = steps
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let tail: Vec<&StepRecord> = steps.iter().filter(|r| r.step >= from).collect();
    serde_json::to_string(&tail).unwrap_or_else(|e| {
        tracing::error!("cannot render steps: {e}");
        "[]".into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::App;
    use actix_web::http::Method;
    use actix_web::test::{TestRequest, call_service, init_service, read_body};

    /// Status code and body of `method url` against the routes.
    fn call(json: &Published, method: Method, url: &str) -> (u16, String) {
        let json = json.clone();
        let url = url.to_owned();
        actix_web::rt::System::new().block_on(async move {
            let metrics = Arc::new(Metrics::default());
            let app = init_service(App::new().configure(routes(json, metrics))).await;
            let request = TestRequest::default().method(method).uri(&url).to_request();
            let response = call_service(&app, request).await;
            let code = response.status().as_u16();
            let body = read_body(response).await;
            (code, String::from_utf8_lossy(&body).into_owned())
        })
    }

    #[test]
    fn steps_are_rendered_from_the_asked_step() {
        let json = Published::default();
        let record = |step| StepRecord {
            step,
            epoch: 1,
            sample_start: step * 16,
            samples: 16,
            loss: 1.5,
            validation_loss: None,
            history: 0,
            outer_digests: Vec::new(),
            groups: Vec::new(),
            partition: Vec::new(),
        };
        json.steps.write().unwrap().extend((0..5).map(record));
        let body = |url| call(&json, Method::GET, url).1;
        let all: Vec<serde_json::Value> = serde_json::from_str(&body("/steps")).unwrap();
        assert_eq!(all.len(), 5);
        let tail: Vec<serde_json::Value> = serde_json::from_str(&body("/steps?from=3")).unwrap();
        assert_eq!(tail.len(), 2);
        assert_eq!(tail[0]["step"], 3);
        assert_eq!(tail[1]["sample_start"], 64);
    }

    #[test]
    fn routes_answer_only_get_on_their_paths() {
        let json = Published::default();
        let code = |method, url| call(&json, method, url).0;
        assert_eq!(code(Method::GET, "/status"), 200);
        assert_eq!(code(Method::GET, "/metrics"), 200);
        assert_eq!(code(Method::GET, "/steps"), 200);
        assert_eq!(code(Method::GET, "/healthz"), 200);
        assert_eq!(
            call(&json, Method::GET, "/readyz"),
            (503, "not ready: not a member of a cluster yet\n".into())
        );
        *json.ready.write().unwrap() = Ok(());
        assert_eq!(call(&json, Method::GET, "/readyz"), (200, "ready\n".into()));
        assert_eq!(code(Method::GET, "/nope"), 404);
        assert_eq!(code(Method::GET, "/steps?from=x"), 400);
        assert_eq!(code(Method::GET, "/steps?to=1"), 400);
        assert_eq!(code(Method::POST, "/status"), 405);
    }
}
