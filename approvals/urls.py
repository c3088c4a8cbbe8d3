from __future__ import annotations

from django.urls import path

from approvals import views

urlpatterns = [
    path("", views.inbox, name="approvals-inbox"),
    path("<int:pk>/", views.detail, name="approvals-detail"),
    path("<int:pk>/decide", views.decide, name="approvals-decide"),
    path("<int:pk>/reopen", views.reopen, name="approvals-reopen"),
]
