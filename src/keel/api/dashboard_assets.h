#pragma once
// The dashboard's files (web/, built by the build and embedded by scripts/embed-dashboard.py),
// served by api_dashboard.cc.

#include <cstddef>
#include <string_view>

namespace keel::api {

struct DashboardAsset {
  const char* path;  // "/index.html", "/assets/index-3f2a.js"
  const char* content_type;
  std::string_view body;
  std::string_view gzip;  // the body gzip-compressed
  const char* etag;       // quoted
};

extern const DashboardAsset kDashboardAssets[];
extern const size_t kDashboardAssetCount;

}  // namespace keel::api
