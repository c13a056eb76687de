from django.urls import path

from storage_app.web import views

app_name = "folders"

urlpatterns = [
    path("", views.folder_list, name="list"),
    path("new/", views.folder_create, name="create"),
    path("<uuid:ref>/", views.folder_detail, name="detail"),
    path("<uuid:ref>/delete/", views.folder_delete, name="delete"),
]
