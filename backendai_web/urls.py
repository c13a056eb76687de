from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.shortcuts import redirect
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from backendai_web import __version__
from sessions_app.api import SessionViewSet

router = DefaultRouter()
router.register("sessions", SessionViewSet, basename="session")


def root(request):
    """Backend.AI clients read the API version here; a browser goes to the dashboard."""
    if request.get_preferred_type(["application/json", "text/html"]) == "text/html":
        return redirect("dashboard:sessions")
    return JsonResponse({"version": "v7.20230615", "manager": __version__})


urlpatterns = [
    path("", root, name="root"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("sessions/", include("sessions_app.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include(router.urls)),
]
