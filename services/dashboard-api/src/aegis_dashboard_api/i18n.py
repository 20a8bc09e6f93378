"""The page's labels in Korean and English, and which language a request gets: ``?lang=`` (kept
in a cookie), else the cookie, else the browser's Accept-Language, else English."""

from __future__ import annotations

from typing import Literal

Lang = Literal["ko", "en"]
LANGS: tuple[Lang, ...] = ("ko", "en")
LANG_COOKIE = "aegis_lang"

LABELS: dict[str, dict[Lang, str]] = {
    "title": {"en": "AEGIS operations", "ko": "AEGIS 운영 현황"},
    "fleet": {"en": "Fleet", "ko": "공장 현황"},
    "cloud": {"en": "Cloud infra", "ko": "클라우드 인프라"},
    "reports": {"en": "Reports", "ko": "보고서"},
    "alerts": {"en": "Open alerts", "ko": "발생 중인 경보"},
    "no_alerts": {"en": "No open alerts", "ko": "발생 중인 경보 없음"},
    "no_factories": {
        "en": "No factory has reported yet",
        "ko": "아직 데이터를 보낸 공장이 없습니다",
    },
    "NORMAL": {"en": "Normal", "ko": "정상"},
    "WARNING": {"en": "Warning", "ko": "주의"},
    "CRITICAL": {"en": "Critical", "ko": "위험"},
    "UNKNOWN": {"en": "Unknown", "ko": "알 수 없음"},
    "stale": {"en": "Stale", "ko": "지연"},
    "offline": {"en": "Offline", "ko": "오프라인"},
    "score": {"en": "Risk score", "ko": "위험 점수"},
    "reasons": {"en": "Reasons", "ko": "원인"},
    "no_reasons": {"en": "No active reasons", "ko": "감지된 원인 없음"},
    "last_data": {"en": "Last data", "ko": "최근 데이터"},
    "ago": {"en": "ago", "ko": "전"},
    "pipeline": {"en": "Pipeline", "ko": "파이프라인"},
    "updated": {"en": "Updated", "ko": "갱신"},
    "window": {"en": "Window", "ko": "기간"},
    "sensors": {"en": "Sensors", "ko": "센서"},
    "risk": {"en": "Risk score", "ko": "위험 점수"},
    "ai": {"en": "AI detections (confidence)", "ko": "AI 탐지 (신뢰도)"},
    "infra": {"en": "Edge infrastructure", "ko": "엣지 인프라"},
    "camera": {"en": "Latest camera image", "ko": "최근 카메라 이미지"},
    "no_image": {"en": "No image yet", "ko": "이미지 없음"},
    "no_data": {"en": "No data in this window", "ko": "이 기간의 데이터가 없습니다"},
    "factory_alerts": {"en": "Open alerts of this factory", "ko": "이 공장의 경보"},
    "overall": {"en": "Overall", "ko": "종합"},
    "fast": {"en": "Fast checks (1 min)", "ko": "빠른 점검 (1분)"},
    "slow": {"en": "Slow checks (5 min)", "ko": "느린 점검 (5분)"},
    "check": {"en": "Check", "ko": "점검 항목"},
    "status": {"en": "Status", "ko": "상태"},
    "value": {"en": "Value", "ko": "측정값"},
    "history": {"en": "History", "ko": "이력"},
    "no_cloud": {"en": "No collector run yet", "ko": "아직 수집된 점검 결과가 없습니다"},
    "date": {"en": "Report date (KST)", "ko": "보고서 날짜 (KST)"},
    "show": {"en": "Show", "ko": "보기"},
    "no_reports": {"en": "No report for this date", "ko": "이 날짜의 보고서가 없습니다"},
    "choose_report": {"en": "Choose a report", "ko": "보고서를 선택하세요"},
    "live": {"en": "Live", "ko": "실시간"},
    "reconnecting": {"en": "Reconnecting…", "ko": "재연결 중…"},
    "sign_in": {"en": "Sign in", "ko": "로그인"},
    "sign_out": {"en": "Sign out", "ko": "로그아웃"},
    "token": {"en": "Access token", "ko": "접근 토큰"},
    "token_help": {
        "en": "A read-only dashboard token from your administrator.",
        "ko": "관리자에게 받은 읽기 전용 대시보드 토큰입니다.",
    },
    "bad_token": {"en": "That token is not valid.", "ko": "유효하지 않은 토큰입니다."},
    "need_token": {"en": "Sign in to see the dashboard.", "ko": "대시보드를 보려면 로그인하세요."},
    "unknown_factory": {"en": "Unknown factory", "ko": "알 수 없는 공장"},
    "back": {"en": "Back to the fleet", "ko": "공장 현황으로"},
    "language": {"en": "Language", "ko": "언어"},
    "severity": {"en": "Severity", "ko": "등급"},
    "scope": {"en": "Where", "ko": "대상"},
    "reason": {"en": "Reason", "ko": "원인"},
    "since": {"en": "Since", "ko": "시작"},
    "factories_n": {"en": "factories", "ko": "개 공장"},
    "times_kst": {"en": "Times in KST (hover: UTC)", "ko": "시간은 KST (마우스를 올리면 UTC)"},
}


def labels(lang: Lang) -> dict[str, str]:
    return {key: text[lang] for key, text in LABELS.items()}


def pick_lang(query: str | None, cookie: str | None, accept_language: str | None) -> Lang:
    for choice in (query, cookie):
        if choice in LANGS:
            return choice
    return from_accept_language(accept_language or "")


def from_accept_language(header: str) -> Lang:
    """The supported language the browser prefers most (``ko-KR,ko;q=0.9,en;q=0.8``)."""
    best: tuple[float, int, Lang] | None = None
    for position, part in enumerate(header.split(",")):
        tag, _, params = part.strip().partition(";")
        primary = tag.strip().lower().split("-")[0]
        if primary not in LANGS:
            continue
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.strip().partition("=")
            if name == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if q > 0 and (best is None or (q, -position) > (best[0], best[1])):
            best = (q, -position, primary)
    return best[2] if best else "en"
