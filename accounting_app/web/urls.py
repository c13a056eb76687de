from django.urls import path

from accounting_app.web import views

app_name = "usage"

urlpatterns = [
    path("", views.usage_page, name="page"),
]
