from django.urls import path

from sessions_app.web import views as dashboard

app_name = "dashboard"

urlpatterns = [
    path("", dashboard.session_list, name="sessions"),
    path("new/", dashboard.session_create, name="session-create"),
    path("overview/", dashboard.overview, name="overview"),
    path("queue/", dashboard.queue, name="queue"),
    path("<uuid:pk>/", dashboard.session_detail, name="session-detail"),
    path("<uuid:pk>/terminate/", dashboard.session_terminate, name="session-terminate"),
    path("<uuid:pk>/stop/", dashboard.session_stop, name="session-stop"),
    path("<uuid:pk>/resume/", dashboard.session_resume, name="session-resume"),
]
