from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from rest_framework.routers import DefaultRouter

from backendai_web import __version__
from sessions_app.api import SessionViewSet

router = DefaultRouter()
router.register("sessions", SessionViewSet, basename="session")


def root(request):
    return JsonResponse({"version": "v7.20230615", "manager": __version__})


urlpatterns = [
    path("", root, name="root"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(router.urls)),
]
