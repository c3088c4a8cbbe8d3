"""Finance's pages, mounted by console/urls.py at ``review/``."""

from __future__ import annotations

from django.urls import path

from actions.review import views

urlpatterns = [
    path("", views.queue, name="review-queue"),
    path("actions/<int:pk>/", views.action_detail, name="review-action"),
    path("workflows/<int:pk>/", views.workflow_timeline, name="workflow-timeline"),
    path("actions/<int:pk>/evidence", views.action_evidence, name="review-action-evidence"),
    path("actions/<int:pk>/assign", views.action_assign, name="review-action-assign"),
    path("actions/<int:pk>/lookup", views.action_lookup, name="review-action-lookup"),
    path("actions/<int:pk>/resolve", views.action_resolve, name="review-action-resolve"),
    path("actions/<int:pk>/escalate", views.action_escalate, name="review-action-escalate"),
    path("remedies/<int:pk>/", views.remedy_detail, name="review-remedy"),
    path("remedies/<int:pk>/assign", views.remedy_assign, name="review-remedy-assign"),
    path("remedies/<int:pk>/advance", views.remedy_advance, name="review-remedy-advance"),
    path("discrepancies/<int:pk>/", views.discrepancy_detail, name="review-discrepancy"),
    path("discrepancies/<int:pk>/assign", views.discrepancy_assign, name="review-discrepancy-assign"),
    path("discrepancies/<int:pk>/advance", views.discrepancy_advance, name="review-discrepancy-advance"),
]
